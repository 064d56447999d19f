// Charts and the compare view's rendering, shared by the compare page and the HTML report
// (which inlines this file with its data). uPlot draws; labels are set as text.
"use strict";

const TTFT_CHARTS = (() => {
  const { el, ms } = TTFT;
  const PALETTE = ["#2e6fdb", "#d92d20", "#12b76a", "#f79009", "#7a5af8", "#0e9384", "#c11574", "#667085"];

  function width(root) { return Math.max(320, Math.min(1300, (root.clientWidth || 900) - 10)); }

  function timeChart(root, title, data, series, options) {
    // data: [xs, ...ys]; series: [{label, stroke, fill, points, paths}] for each y.
    const opts = options || {};
    const box = el("div", { class: "chart", "data-chart": title, "data-points": data[0].length });
    root.append(el("h2", {}, title), box);
    const plot = new uPlot({
      width: width(root), height: opts.height || 220,
      scales: { x: { time: opts.time !== false }, y: opts.yRange ? { range: opts.yRange } : {} },
      series: [{ label: opts.xLabel || "time" }, ...series],
      bands: opts.bands || [],
      axes: [{}, { label: opts.yLabel || "", size: 60 }],
      hooks: opts.hooks || {},
      cursor: opts.cursor || {},
      legend: { show: true },
    }, data, box);
    box.uplot = plot;
    return plot;
  }

  function barChart(root, title, groups, keys, valueOf, labelOf) {
    // Grouped bars as SVG: one group per `groups` item, one bar per key.
    const ns = "http://www.w3.org/2000/svg";
    const w = Math.min(900, width(root)), h = 240, pad = 46, barW = 18;
    const values = groups.flatMap((g) => keys.map((k) => valueOf(g, k))).filter((v) => v !== null && v !== undefined);
    const top = Math.max(1, ...values) * 1.1;
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "bars");
    svg.setAttribute("role", "img"); svg.setAttribute("aria-label", title);
    const groupW = (w - pad) / Math.max(groups.length, 1);
    const text = (x, y, content, anchor) => {
      const t = document.createElementNS(ns, "text");
      t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "11");
      t.setAttribute("text-anchor", anchor || "middle"); t.textContent = content; svg.append(t);
    };
    for (let tick = 0; tick <= 4; tick++) {
      const v = (top / 4) * tick, y = h - 24 - (v / top) * (h - 40);
      text(pad - 4, y + 4, ms(v), "end");
    }
    groups.forEach((g, gi) => {
      const x0 = pad + gi * groupW + (groupW - keys.length * (barW + 3)) / 2;
      keys.forEach((k, ki) => {
        const v = valueOf(g, k);
        if (v === null || v === undefined) return;
        const rect = document.createElementNS(ns, "rect");
        const bh = (v / top) * (h - 40);
        rect.setAttribute("x", x0 + ki * (barW + 3)); rect.setAttribute("y", h - 24 - bh);
        rect.setAttribute("width", barW); rect.setAttribute("height", bh);
        rect.setAttribute("fill", PALETTE[ki % PALETTE.length]);
        const tip = document.createElementNS(ns, "title");
        tip.textContent = `${k} · ${labelOf(g)}: ${ms(v)} ms`;
        rect.append(tip); svg.append(rect);
      });
      text(pad + gi * groupW + groupW / 2, h - 8, labelOf(g));
    });
    const legend = el("div", { class: "legend" }, keys.map((k, ki) =>
      el("span", { style: `color:${PALETTE[ki % PALETTE.length]}; margin-right:14px` }, "■ ", el("span", { style: "color:#1d2430" }, k))));
    root.append(el("h2", {}, title), svg, legend);
  }

  function renderCompare(root, data, options) {
    const opts = options || {};
    const csv = opts.csvBase ? (table) => TTFT.csvLink(`${opts.csvBase}&table=${table}`) : () => null;
    const prompts = [...new Set(data.cells.map((c) => c.prompt))];
    const targets = [...new Set(data.cells.map((c) => c.target))];
    prompts.sort((a, b) => promptTokens(data, a) - promptTokens(data, b));
    if (!data.cells.length) {
      root.append(el("p", { class: "muted" }, "No successful samples in this range and selection."));
      return;
    }
    root.append(el("h2", {}, "TTFT by target and prompt (ms)", csv("cells")));
    root.append(TTFT.table([
      { key: "target", label: "target" },
      { key: "model", label: "model" },
      { key: "prompt", label: "prompt" },
      { key: "prompt_tokens_median", label: "prompt tokens", numeric: true, format: (r) => r.prompt_tokens_median === null ? "–" : Math.round(r.prompt_tokens_median).toLocaleString("en") },
      { key: "n", label: "n", numeric: true },
      { key: "median_ms", label: "median", numeric: true, format: (r) => ms(r.median_ms) },
      { key: "ci", label: "95% interval", numeric: true, sort: (r) => r.ci_low_ms, format: (r) => `${ms(r.ci_low_ms)} – ${ms(r.ci_high_ms)}` },
      { key: "p90_ms", label: "p90", numeric: true, format: (r) => ms(r.p90_ms) },
    ], data.cells, { class: "cells" }));

    root.append(el("h2", {}, "Pairwise differences of medians", csv("pairs")));
    const list = el("ul", { class: "pairs" });
    for (const p of data.pairs) {
      list.append(el("li", { class: p.significant ? "significant" : null, "data-faster": p.faster, "data-slower": p.slower },
        `${p.prompt}: `, el("b", {}, p.faster), " is faster than ", el("b", {}, p.slower),
        ` by ${ms(p.difference_ms)} ms (95% interval ${ms(p.ci_low_ms)} – ${ms(p.ci_high_ms)}), `,
        p.significant ? "significant" : "not significant"));
    }
    root.append(list);

    barChart(root, "Median TTFT per prompt size (ms)", prompts, targets,
      (prompt, target) => { const c = data.cells.find((x) => x.prompt === prompt && x.target === target); return c ? c.median_ms : null; },
      (prompt) => prompt);

    root.append(el("h2", {}, "Prefill slope: ms per 1,000 prompt tokens", csv("slopes")));
    root.append(TTFT.table([
      { key: "rank", label: "rank", numeric: true, format: (r) => (r.rank === null ? "–" : String(r.rank)) },
      { key: "target", label: "target" },
      { key: "model", label: "model" },
      // No slope without two prompt sizes or a significant fit: "n/a" and why, never a number to rank.
      { key: "ms_per_1k_tokens", label: "ms / 1K tokens", numeric: true,
        format: (r) => (r.reason ? `n/a: ${r.reason}` : ms(r.ms_per_1k_tokens)) },
      { key: "intercept_ms", label: "intercept ms", numeric: true, format: (r) => ms(r.intercept_ms) },
      { key: "points", label: "samples", numeric: true },
    ], data.slopes, { class: "slopes" }));

    const withTokens = data.cells.filter((c) => c.prompt_tokens_median !== null);
    if (withTokens.length && typeof uPlot !== "undefined") {
      const xs = [...new Set(withTokens.map((c) => c.prompt_tokens_median))].sort((a, b) => a - b);
      const ys = [], series = [];
      targets.forEach((t, i) => {
        const color = PALETTE[i % PALETTE.length];
        ys.push(xs.map((x) => { const c = withTokens.find((k) => k.target === t && k.prompt_tokens_median === x); return c ? c.median_ms : null; }));
        series.push({ label: `${t} median`, stroke: color, paths: () => null, points: { show: true, size: 8, fill: color } });
        const fit = data.slopes.find((s) => s.target === t);
        ys.push(xs.map((x) => fit && fit.ms_per_1k_tokens !== null ? fit.intercept_ms + fit.ms_per_1k_tokens * x / 1000 : null));
        series.push({ label: `${t} fit`, stroke: color, dash: [6, 4], points: { show: false }, spanGaps: true });
      });
      timeChart(root, "TTFT against prompt tokens", [xs, ...ys], series, { time: false, xLabel: "prompt tokens", yLabel: "ms" });
    }
  }

  function promptTokens(data, prompt) {
    const values = data.cells.filter((c) => c.prompt === prompt && c.prompt_tokens_median !== null).map((c) => c.prompt_tokens_median);
    return values.length ? Math.min(...values) : Infinity;
  }

  return { PALETTE, timeChart, barChart, renderCompare };
})();
