"use strict";
(() => {
  const { el, ms, pct } = TTFT;
  const main = TTFT.page("Overview");
  const ORDER = ["page", "down", "ticket", "no data", "ok"];

  function statusBadge(status) {
    return el("span", { class: `status status-${status.replace(" ", "-")}`, "data-status": status }, status);
  }

  async function load() {
    main.replaceChildren(el("h1", {}, "Overview", TTFT.csvLink("/api/v1/series")));
    let data;
    try { data = await TTFT.getJSON("/api/v1/series"); } catch (e) { TTFT.showError(main, e); return; }
    main.append(el("p", { class: "muted" }, `${data.series.length} series · as of ${TTFT.when(data.now)} · worst first`));
    // Jobs a crossed budget holds (`budget.*.action`): never silently.
    for (const hold of data.budget_holds || []) {
      main.append(el("p", { class: "budget-hold", "data-job": hold.job },
        `Job ${hold.job} is ${hold.action === "pause" ? "paused" : "reduced to 1 round and no warm-up"} by budget.${hold.budget} (on course to exceed its ${hold.per}ly limit) until ${TTFT.when(hold.until)}`));
    }
    const groups = new Map();
    for (const row of data.series) {
      if (!groups.has(row.provider)) groups.set(row.provider, []);
      groups.get(row.provider).push(row);
    }
    const columns = [
      { key: "status", label: "status", sort: (r) => ORDER.indexOf(r.status), format: (r) => statusBadge(r.status) },
      { key: "target", label: "target", format: (r) => el("a", { href: `/series?id=${encodeURIComponent(r.id)}`, class: "series-link" }, r.target) },
      { key: "model", label: "model" },
      // The target's SLO across its prompts (burn-rate incidents, prompt `*`): no latency of its own.
      { key: "prompt", label: "prompt", format: (r) => r.scope === "target"
        ? el("span", { class: "muted", "data-scope": "target", title: "the target's TTFT objective over all its prompts (SLO burn rate)" }, "all prompts (SLO)")
        : r.prompt },
      { key: "location", label: "location" },
      { key: "p50_last_hour_ms", label: "p50 last hour ms", numeric: true, format: (r) => ms(r.p50_last_hour_ms) },
      // No baseline yet: why (the detector still learning, or the series' first hour), not a dash.
      { key: "baseline_ms", label: "baseline ms", numeric: true,
        format: (r) => r.baseline_ms === null && r.baseline_note ? el("span", { class: "muted", "data-baseline-note": "" }, r.baseline_note) : ms(r.baseline_ms) },
      { key: "ratio", label: "ratio", numeric: true, format: (r) => r.ratio === null ? "–" : `×${r.ratio.toFixed(2)}` },
      { key: "sparkline", label: "24 h", sort: (r) => r.p50_last_hour_ms, format: (r) => TTFT.sparkline(r.sparkline_ms, 120, 24) },
      { key: "availability_24h", label: "avail. 24 h", numeric: true, format: (r) => pct(r.availability_24h) },
      { key: "availability_7d", label: "7 d", numeric: true, format: (r) => pct(r.availability_7d) },
      { key: "availability_30d", label: "30 d", numeric: true, format: (r) => pct(r.availability_30d) },
      // What probing the series costs a month at its schedule (from the last day's probes where there are some).
      { key: "cost", label: "probing / month", numeric: true, sort: (r) => (r.cost ? r.cost.cost_per_month ?? r.cost.tokens_per_month : -1), format: (r) => TTFT.costText(r.cost) },
    ];
    if (!data.series.length) main.append(el("p", { class: "muted" }, "No series yet: the daemon has not stored a run."));
    for (const [provider, rows] of groups) {
      main.append(el("section", { class: "group", "data-provider": provider }, el("h2", {}, provider),
        TTFT.table(columns, rows, { class: "overview", rowClass: (r) => `row-${r.status.replace(" ", "-")}` })));
    }
    main.setAttribute("data-loaded", "1");
  }

  load();
  setInterval(() => { if (!document.hidden) load(); }, 60000);
})();
