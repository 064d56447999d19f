"use strict";
(() => {
  const { el, ms } = TTFT;
  const main = TTFT.page("Series");
  const params = new URLSearchParams(location.search);
  const RANGES = { "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400, "90d": 90 * 86400 };
  const PHASES = [
    ["ttfa_ms", "first answer"], ["ttft_ms", "first token"], ["first_event_ms", "first event"],
    ["ttfb_ms", "headers"], ["setup", "DNS + connect + TLS"],
  ];

  async function resolveId() {
    if (params.get("id")) return params.get("id");
    // Notification links name the series Grafana-style: var-target, var-prompt, var-location.
    const want = { target: params.get("var-target"), prompt: params.get("var-prompt"), location: params.get("var-location") };
    const list = await TTFT.getJSON("/api/v1/series");
    const found = list.series.find((s) => Object.entries(want).every(([k, v]) => v === null || s[k] === v));
    if (!found) throw new Error("no series matches this link's target, prompt and location");
    return String(found.id);
  }

  function windowFor(range) {
    const seconds = RANGES[range];
    if (params.get("at")) {
      const at = Date.parse(params.get("at"));
      if (!Number.isNaN(at)) {
        const end = Math.min(Date.now(), at + (seconds * 1000) / 2);
        return { start: new Date(end - seconds * 1000).toISOString(), end: new Date(end).toISOString() };
      }
    }
    return { since: range };
  }

  function shadeIncidents(u, incidents) {
    // Incidents as shaded spans over the plot area, positioned on every redraw.
    u.over.querySelectorAll(".incident-shade").forEach((node) => node.remove());
    const [x0, x1] = [u.scales.x.min, u.scales.x.max];
    for (const item of incidents) {
      const a = Math.max(TTFT.epoch(item.since || item.opened_at), x0);
      const b = Math.min(item.resolved_at ? TTFT.epoch(item.resolved_at) : x1, x1);
      if (b <= a) continue;
      const left = u.valToPos(a, "x"), right = u.valToPos(b, "x");
      u.over.append(el("div", {
        class: "incident-shade", "data-incident": item.id, title: `${item.kind} ${item.severity}`,
        style: `position:absolute; top:0; bottom:0; left:${left}px; width:${Math.max(2, right - left)}px; ` +
          `background:${item.severity === "page" ? "rgba(217,45,32,0.16)" : "rgba(247,144,9,0.16)"}; pointer-events:none`,
      }));
    }
  }

  function tooltipPlugin(points) {
    const tip = el("div", { class: "tooltip", hidden: true });
    return {
      hooks: {
        init: (u) => { u.over.append(tip); },
        setCursor: (u) => {
          const i = u.cursor.idx;
          if (i === null || i === undefined || !points[i]) { tip.hidden = true; return; }
          const p = points[i];
          const lines = [TTFT.when(p.t), `TTFT p50 ${ms(p.ttft_p50_ms)} ms`, `n ${p.n}, errors ${p.errors}`];
          if (p.baseline_ms !== null && p.baseline_ms !== undefined) lines.push(`baseline ${ms(p.baseline_ms)} ms`);
          if (p.server_ttft_ms !== null && p.server_ttft_ms !== undefined) lines.push(`server TTFT ${ms(p.server_ttft_ms)} ms`);
          if (p.run_id) lines.push(`run ${p.run_id}`);
          if (p.request_id) lines.push(`request id ${p.request_id}`);
          if (p.error_message) lines.push(`error: ${p.error_message}`);
          if (p.self_delay_ms !== null && p.self_delay_ms !== undefined) lines.push(`monitor's own delay ${ms(p.self_delay_ms)} ms`);
          if (p.disturbed) lines.push(p.disturbed === true ? "disturbed: not evidence for detection" : `${p.disturbed} disturbed: not evidence for detection`);
          tip.textContent = lines.join("\n");
          tip.hidden = false;
          tip.style.left = `${Math.min(u.cursor.left + 12, u.over.clientWidth - 240)}px`;
          tip.style.top = `${u.cursor.top + 12}px`;
        },
      },
    };
  }

  function splitNote(split) {
    // Where the time went, in the alerts' words; the numbers alone when TTFT did not grow.
    const when = `${TTFT.when(split.since)} – ${TTFT.when(split.until)}`;
    const numbers = [`client TTFT ${ms(split.client_ttft_ms)} ms (baseline ${ms(split.client_baseline_ms)})`];
    if (split.ttft_ms !== null) numbers.push(`server TTFT ${ms(split.ttft_ms)} ms (baseline ${ms(split.ttft_baseline_ms)})`);
    const count = (v) => (v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en"));
    if (split.waiting !== null) numbers.push(`${count(split.waiting)} requests waiting (baseline ${count(split.waiting_baseline)})`);
    return el("p", { class: "split", "data-cause": split.cause || "none" },
      el("strong", {}, split.incident_id ? "Where the time went during the regression: " : "Where the time went, last hour: "),
      split.text || numbers.join("; "), el("span", { class: "muted" }, ` · ${when}`));
  }

  function serverCharts(xs, pts, col) {
    // The server's own metrics per run (providers with server_metrics_url), beside the client's TTFT.
    const has = (key) => pts.some((p) => p[key] !== null && p[key] !== undefined);
    if (!["server_ttft_ms", "server_queue_ms", "server_prefill_ms", "server_waiting"].some(has)) {
      main.append(el("h2", {}, "Where the time went"), el("p", { class: "muted no-server-metrics" },
        "No server metrics for this series: name the provider's Prometheus endpoint (server_metrics_url) to split TTFT into the server's queue, its prefill and the rest."));
      return;
    }
    TTFT_CHARTS.timeChart(main, "Where the time went (ms): client TTFT beside the server's own TTFT, queue and prefill",
      [xs, col("ttft_p50_ms"), col("server_ttft_ms"), col("server_queue_ms"), col("server_prefill_ms")], [
        { label: "client TTFT p50", stroke: "#2e6fdb", width: 1.5, points: { show: false } },
        { label: "server TTFT", stroke: "#7a5af8", points: { show: false } },
        { label: "server queue", stroke: "#d92d20", points: { show: false } },
        { label: "server prefill", stroke: "#0e9384", points: { show: false } },
      ], { yLabel: "ms", height: 220 });
    TTFT_CHARTS.timeChart(main, "Server load: requests waiting and running",
      [xs, col("server_waiting"), col("server_running")], [
        { label: "waiting", stroke: "#d92d20", points: { show: false } },
        { label: "running", stroke: "#667085", points: { show: false } },
      ], { yLabel: "requests", height: 160 });
    const percent = (key) => pts.map((p) => (p[key] === null || p[key] === undefined ? null : p[key] * 100));
    TTFT_CHARTS.timeChart(main, "Server caches (%): KV-cache usage and prefix-cache hit rate",
      [xs, percent("server_kv_cache_usage"), percent("server_prefix_hit_rate")], [
        { label: "KV-cache usage", stroke: "#f79009", points: { show: false } },
        { label: "prefix-cache hit rate", stroke: "#12b76a", points: { show: false } },
      ], { yLabel: "%", height: 160 });
  }

  // A `cache: both` pair: is the prompt cache working? The speed-up of the warm probes over the cold ones
  // and the share of the warm prompt served from the cache, per run, with a link to the other series.
  function cacheChart(cache, s) {
    const other = s.prompt === cache.warm_prompt ? [cache.cold_prompt, cache.cold_series_id] : [cache.warm_prompt, cache.warm_series_id];
    const share = cache.cached_share_p50 === null ? "" : `, ${Math.round(cache.cached_share_p50 * 100)}% of the warm prompt served from the cache`;
    main.append(el("p", { class: "cache-note" },
      `Prompt cache (${cache.cold_prompt} busted, ${cache.warm_prompt} warm): speed-up over cold ${cache.speedup_p50 === null ? "–" : `${cache.speedup_p50}×`} (median of ${cache.runs} runs)${share} · `,
      el("a", { href: `/series?id=${encodeURIComponent(other[1])}` }, `series ${other[0]}`)));
    const cx = cache.points.map((p) => TTFT.epoch(p.t));
    TTFT_CHARTS.timeChart(main, "Prompt cache: warm speed-up over cold (×) and cached share of the warm prompt (%)",
      [cx, cache.points.map((p) => p.speedup), cache.points.map((p) => (p.cached_share === null ? null : p.cached_share * 100))], [
        { label: "speed-up ×", stroke: "#7a5af8", points: { show: cache.points.length < 400, size: 4 } },
        { label: "cached %", stroke: "#f79009", points: { show: false } },
      ], { height: 160 });
  }

  async function load(range) {
    main.replaceChildren(el("h1", {}, "Series"));
    let id, data;
    try {
      id = await resolveId();
      const query = new URLSearchParams(windowFor(range));
      data = await TTFT.getJSON(`/api/v1/series/${encodeURIComponent(id)}/points?${query}`);
    } catch (e) { TTFT.showError(main, e); return; }
    const s = data.series;
    main.replaceChildren(
      el("h1", {}, `${s.target} · ${s.prompt} · ${s.location}`),
      el("p", { class: "muted" }, `${s.provider} · ${s.model} · ${TTFT.when(data.start)} – ${TTFT.when(data.end)} · `,
        `${data.points.length} points (${data.resolution === "sample" ? "raw samples" : data.resolution === "bucket" ? `${data.bucket_s} s buckets of samples` : "hourly rollups"})`,
        data.baseline_ms !== null ? ` · baseline ${ms(data.baseline_ms)} ms` : "",
        // The detector's noise model beside the baseline: how far this series wanders, and for how long.
        data.noise ? ` (${data.noise.text.replace(/; equivalent.*$/, "")})` : "",
        // What probing this series costs a month at its schedule.
        data.cost ? ` · probing ${TTFT.costText(data.cost)} a month` : "",
        TTFT.csvLink(`/api/v1/series/${encodeURIComponent(id)}/points?${new URLSearchParams(windowFor(range))}`)),
      el("div", { class: "controls" }, Object.keys(RANGES).map((r) =>
        el("button", { type: "button", class: r === range ? "active" : null, onclick: () => { params.set("range", r); history.replaceState(null, "", `?${params}`); load(r); } }, r))),
    );
    const pts = data.points;
    const xs = pts.map((p) => TTFT.epoch(p.t));
    const col = (key) => pts.map((p) => p[key] ?? null);
    // The baseline the detector compared each point's run with (seasonal once the series has days of
    // history); none where it had none yet: the line at t is never a baseline from after t.
    const baseline = pts.map((p) => p.baseline_ms ?? null);
    const incidentBaselines = data.incidents.filter((i) => i.opened_baseline_ms !== null);
    // The baseline's band: up to where the detector opens a ticket; the page line above it.
    const limits = data.thresholds || {};
    const times = (ratio) => baseline.map((b) => (b === null || !ratio ? null : b * ratio));
    const ttftSeries = [
      { label: "p10", stroke: "rgba(46,111,219,0.35)", points: { show: false } },
      { label: "p50", stroke: "#2e6fdb", width: 1.5, points: { show: pts.length < 400, size: 4 } },
      { label: "p90", stroke: "rgba(46,111,219,0.35)", points: { show: false } },
      { label: "baseline", stroke: "#12b76a", dash: [6, 4], points: { show: false } },
      { label: `ticket ×${limits.ticket_ratio ?? "–"}`, stroke: "rgba(247,144,9,0.6)", dash: [2, 3], points: { show: false } },
      { label: `page ×${limits.page_ratio ?? "–"}`, stroke: "rgba(217,45,32,0.6)", dash: [2, 3], points: { show: false } },
      // Hollow markers: samples (or buckets holding some) the monitor itself was late around.
      { label: "disturbed", stroke: "#d92d20", paths: () => null, points: { show: true, size: 9, width: 1.5, fill: "rgba(0,0,0,0)" } },
    ];
    const disturbedAt = pts.map((p) => (p.disturbed ? p.ttft_p50_ms ?? null : null));
    // A sample says true; a bucket counts them; hourly rollups do not keep them (undefined).
    const disturbedCount = pts.reduce((sum, p) => sum + (p.disturbed === true ? 1 : typeof p.disturbed === "number" ? p.disturbed : 0), 0);
    const shade = { hooks: { draw: [(u) => shadeIncidents(u, data.incidents)] } };
    const tip = tooltipPlugin(pts);
    if (data.split) main.append(splitNote(data.split));
    TTFT_CHARTS.timeChart(main, "TTFT (ms): p50 with the p10–p90 band, the detector's baseline, incidents shaded",
      [xs, col("ttft_p10_ms"), col("ttft_p50_ms"), col("ttft_p90_ms"), baseline, times(limits.ticket_ratio), times(limits.page_ratio), disturbedAt], ttftSeries, {
        yLabel: "ms", height: 280,
        bands: [{ series: [3, 1], fill: "rgba(46,111,219,0.12)" }, { series: [5, 4], fill: "rgba(18,183,106,0.08)" }],
        hooks: { draw: shade.hooks.draw, init: [tip.hooks.init], setCursor: [tip.hooks.setCursor] },
      });
    if (disturbedCount) {
      main.append(el("p", { class: "muted disturbed-note" },
        `${disturbedCount} disturbed sample${disturbedCount === 1 ? "" : "s"} (hollow markers) excluded from detection: the monitor itself was late around their stamps (probe_self_delay_bound_ms)`));
    }
    if (incidentBaselines.length) {
      main.append(el("p", { class: "muted incidents-note" }, data.incidents.map((i) =>
        `${i.kind} ${i.severity} from ${TTFT.when(i.opened_at)}${i.resolved_at ? ` to ${TTFT.when(i.resolved_at)}` : " (open)"}${TTFT.incidentFigures(i)}`).join("; ")));
    }
    if (data.cache) cacheChart(data.cache, s);
    const setup = pts.map((p) => (p.dns_ms ?? 0) + (p.connect_ms ?? 0) + (p.tls_ms ?? 0) || null);
    const colors = ["#7a5af8", "#2e6fdb", "#0e9384", "#f79009", "#667085"];
    TTFT_CHARTS.timeChart(main, "Phases from send (ms): each layer ends when that phase is reached",
      [xs, ...PHASES.map(([key]) => (key === "setup" ? setup : col(key)))],
      PHASES.map(([, label], i) => ({ label, stroke: colors[i], fill: colors[i] + "55", points: { show: false } })), { yLabel: "ms" });
    serverCharts(xs, pts, col);
    const classes = [...new Set(pts.flatMap((p) => Object.keys(p.error_counts || {})))].sort();
    TTFT_CHARTS.timeChart(main, "Errors by class", [xs, ...(classes.length ? classes : ["none"]).map((c) => pts.map((p) => (p.error_counts || {})[c] ?? 0))],
      (classes.length ? classes : ["none"]).map((c, i) => ({ label: c, stroke: TTFT_CHARTS.PALETTE[(i + 1) % 8], points: { show: true, size: 3 } })), { yLabel: "errors", height: 160 });
    TTFT_CHARTS.timeChart(main, "Decode rate (tokens/s)", [xs, col("decode_tps")], [{ label: "decode tokens/s", stroke: "#0e9384", points: { show: false } }], { height: 160 });
    TTFT_CHARTS.timeChart(main, "Prompt and cached tokens", [xs, col("prompt_tokens"), col("cached_tokens")],
      [{ label: "prompt tokens", stroke: "#2e6fdb", points: { show: false } }, { label: "cached tokens", stroke: "#f79009", points: { show: false } }], { height: 160 });
    const failures = pts.filter((p) => p.errors > 0 && p.error_message).slice(-10).reverse();
    if (failures.length) {
      main.append(el("h2", {}, "Recent errors"), el("ul", { class: "recent-errors" }, failures.map((p) =>
        el("li", {}, `${TTFT.when(p.t)} · ${Object.keys(p.error_counts).join(", ")}${p.http_status ? ` · HTTP ${p.http_status}` : ""}: `,
          el("span", { class: "error-message" }, p.error_message),
          p.request_id ? el("span", { class: "muted" }, ` · request ${p.request_id}`) : ""))));
    }
    main.setAttribute("data-loaded", "1");
  }

  const initial = params.get("range") in RANGES ? params.get("range") : "24h";
  load(initial);
})();
