// Shared helpers of the ttft-monitor pages. Data from servers and config is only ever put in the
// page as text (textContent, attributes set one by one): never parsed as HTML.
"use strict";

const TTFT = (() => {
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) throw new Error((body && body.error) || `HTTP ${response.status}`);
    return body;
  }

  // Rounded half to even, as Python's format() does: the CLI and the pages must print the same figure
  // (394.5 ms is "394" in `ttft-monitor incidents`; Math.round made it "395" here).
  const WHOLE = new Intl.NumberFormat("en", { maximumFractionDigits: 0, roundingMode: "halfEven" });
  const TENTH = new Intl.NumberFormat("en", {
    minimumFractionDigits: 1, maximumFractionDigits: 1, roundingMode: "halfEven", useGrouping: false,
  });

  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value >= 100 ? WHOLE.format(value) : TENTH.format(value);
  }

  function pct(value) {
    if (value === null || value === undefined) return "–";
    return (value * 100).toFixed(value >= 0.9995 ? 1 : 2) + "%";
  }

  // A series' `cost` (/api/v1/series): money where the config has prices, else tokens; "≤" marks the
  // schedule's upper bound (max_tokens per request) before any probe has been seen.
  function costText(cost) {
    if (!cost) return "–";
    const bound = cost.from_history ? "" : "≤ ";
    if (cost.cost_per_month !== null) {
      const value = cost.cost_per_month;
      return `${bound}${value >= 0.01 || value === 0 ? value.toFixed(2) : value.toFixed(4)} ${cost.currency}`;
    }
    const tokens = cost.tokens_per_month;
    const shown = tokens >= 1e9 ? `${(tokens / 1e9).toFixed(1)}G` : tokens >= 1e6 ? `${(tokens / 1e6).toFixed(1)}M` : tokens >= 1e3 ? `${(tokens / 1e3).toFixed(0)}k` : String(tokens);
    return `${bound}${shown} tokens`;
  }

  function when(iso) {
    if (!iso) return "–";
    return iso.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC");
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 120) return `${Math.round(seconds)} s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function epoch(iso) { return Date.parse(iso) / 1000; }

  // An incident's figures as `ttft-monitor incidents` prints them (monitor/detect/figures.py): the peak,
  // and the baseline and observed TTFT at opening; a resolved one's last ratio is where it cleared.
  function incidentFigures(item) {
    const parts = [];
    if (item.peak_ratio !== null && item.peak_ratio !== undefined) parts.push(`peak ×${item.peak_ratio.toFixed(2)}`);
    if (item.opened_baseline_ms !== null && item.opened_baseline_ms !== undefined) {
      parts.push(`opened at baseline ${ms(item.opened_baseline_ms)} ms → ${ms(item.opened_observed_ms)} ms`);
    }
    if (item.resolved_at && item.ratio !== null && item.ratio !== undefined) parts.push(`×${item.ratio.toFixed(2)} when resolved`);
    return parts.map((part) => ` · ${part}`).join("");
  }

  function nav(active) {
    const links = [["/", "Overview"], ["/compare", "Compare"], ["/incidents", "Incidents"]];
    // The server marks <body data-signout> when a token protects the pages (a session to end).
    const signout = document.body.dataset.signout
      ? el("form", { method: "post", action: "/logout", class: "signout" },
          el("button", { type: "submit" }, "Sign out"))
      : null;
    return el("nav", {},
      el("span", { class: "brand" }, "ttft-monitor"),
      links.map(([href, label]) => el("a", { href, class: label === active ? "active" : null }, label)),
      signout);
  }

  // A page's frame in #app: the navigation, with this page marked, and the <main> the page fills (returned).
  function page(active) {
    const main = el("main");
    document.getElementById("app").append(nav(active), main);
    return main;
  }

  function showError(root, error) {
    root.append(el("p", { class: "error", role: "alert" }, `Could not load: ${error.message || error}`));
  }

  function seriesName(s) { return `${s.target} · ${s.prompt} · ${s.location}`; }

  function sparkline(values, width, height) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", width); svg.setAttribute("height", height);
    svg.setAttribute("class", "spark");
    const known = values.filter((v) => v !== null);
    if (!known.length) return svg;
    const low = Math.min(...known), high = Math.max(...known), span = high - low || 1;
    let path = "", pen = false;
    values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      const x = (i / Math.max(values.length - 1, 1)) * (width - 2) + 1;
      const y = height - 1 - ((v - low) / span) * (height - 2);
      path += `${pen ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
      pen = true;
    });
    const line = document.createElementNS(ns, "path");
    line.setAttribute("d", path);
    svg.append(line);
    values.forEach((v, i) => {
      // An hour without neighbours draws no line: mark it with a dot.
      if (v === null || (values[i - 1] ?? null) !== null || (values[i + 1] ?? null) !== null) return;
      const dot = document.createElementNS(ns, "circle");
      dot.setAttribute("cx", ((i / Math.max(values.length - 1, 1)) * (width - 2) + 1).toFixed(1));
      dot.setAttribute("cy", (height - 1 - ((v - low) / span) * (height - 2)).toFixed(1));
      dot.setAttribute("r", "2");
      svg.append(dot);
    });
    return svg;
  }

  function table(columns, rows, options) {
    // columns: [{key, label, format?, sort?}]; rows: objects. Click a header to sort.
    const opts = options || {};
    let sortKey = opts.sortKey || null, ascending = true;
    const body = el("tbody");
    const head = el("tr", {}, columns.map((c) => el("th", {
      scope: "col", class: c.numeric ? "num" : null,
      onclick: () => { ascending = sortKey === c.key ? !ascending : true; sortKey = c.key; draw(); },
    }, c.label)));
    function value(row, c) { return c.sort ? c.sort(row) : row[c.key]; }
    function draw() {
      const ordered = rows.slice();
      if (sortKey) {
        const c = columns.find((x) => x.key === sortKey);
        ordered.sort((a, b) => {
          const x = value(a, c), y = value(b, c);
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * (ascending ? 1 : -1);
        });
      }
      body.replaceChildren(...ordered.map((row) => el("tr", { class: opts.rowClass ? opts.rowClass(row) : null },
        columns.map((c) => el("td", { class: c.numeric ? "num" : null }, c.format ? c.format(row) : row[c.key])))));
    }
    draw();
    return el("table", { class: opts.class || null }, el("thead", {}, head), body);
  }

  function csvLink(url) { return el("a", { href: url + (url.includes("?") ? "&" : "?") + "format=csv", class: "csv" }, "CSV"); }

  return { el, getJSON, ms, pct, costText, when, duration, epoch, incidentFigures, page, showError, seriesName, sparkline, table, csvLink };
})();
