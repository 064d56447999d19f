"use strict";
(() => {
  const { el } = TTFT;
  const main = TTFT.page("Compare");
  const params = new URLSearchParams(location.search);
  const since = params.get("since") || "7d";

  async function load() {
    const query = new URLSearchParams();
    query.set("since", since);
    for (const key of ["target", "prompt", "location"]) for (const v of params.getAll(key)) query.append(key, v);
    main.replaceChildren(el("h1", {}, "Compare"));
    let data;
    try { data = await TTFT.getJSON(`/api/v1/compare?${query}`); } catch (e) { TTFT.showError(main, e); return; }
    main.append(controls(data));
    const result = el("div", { id: "compare-result" });
    main.append(result);
    TTFT_CHARTS.renderCompare(result, data, { csvBase: `/api/v1/compare?${query}` });
    main.setAttribute("data-loaded", "1");
  }

  function controls(data) {
    const form = el("form", { class: "controls", method: "get", action: "/compare" });
    const pick = (name, values) => el("fieldset", {}, el("legend", {}, name + "s"),
      values.map((v) => el("label", {}, el("input", { type: "checkbox", name, value: v, checked: params.getAll(name).includes(v) }), " ", v)));
    form.append(pick("target", data.available.targets), pick("prompt", data.available.prompts));
    const ranges = ["1h", "6h", "24h", "7d", "30d", "90d"];
    if (!ranges.includes(since)) ranges.unshift(since);
    const range = el("select", { name: "since" }, ranges.map((r) => el("option", { value: r, selected: r === since }, r)));
    form.append(el("label", {}, "range ", range), el("button", { type: "submit" }, "Compare"));
    return form;
  }

  load();
})();
