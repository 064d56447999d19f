"use strict";
(() => {
  const { el, ms } = TTFT;
  const main = TTFT.page("Incidents");
  const since = new URLSearchParams(location.search).get("since") || "30d";

  function seriesHref(item) {
    const at = item.opened_at;
    return `/series?id=${encodeURIComponent(item.series_id)}&at=${encodeURIComponent(at)}`;
  }

  async function load() {
    main.replaceChildren(el("h1", {}, `Incidents, last ${since}`, TTFT.csvLink(`/api/v1/incidents?since=${encodeURIComponent(since)}`)));
    let data;
    try { data = await TTFT.getJSON(`/api/v1/incidents?since=${encodeURIComponent(since)}`); } catch (e) { TTFT.showError(main, e); return; }
    const start = TTFT.epoch(data.start), end = TTFT.epoch(data.end), span = end - start;
    const timeline = el("div", { class: "timeline", title: `${TTFT.when(data.start)} – ${TTFT.when(data.end)}` });
    for (const item of data.incidents) {
      const a = Math.max(TTFT.epoch(item.opened_at), start), b = item.resolved_at ? TTFT.epoch(item.resolved_at) : end;
      timeline.append(el("a", {
        class: `bar bar-${item.severity}`, href: seriesHref(item),
        style: `left:${((a - start) / span * 100).toFixed(3)}%; width:${Math.max(0.3, (b - a) / span * 100).toFixed(3)}%`,
        title: `${item.target} · ${item.prompt}: ${item.kind} ${item.severity}`,
      }));
    }
    main.append(timeline);
    const open = data.incidents.filter((i) => i.open), recent = data.incidents.filter((i) => !i.open);
    for (const [title, items] of [["Open", open], ["Resolved", recent]]) {
      main.append(el("h2", {}, `${title} (${items.length})`));
      for (const item of items) main.append(card(item));
    }
    main.setAttribute("data-loaded", "1");
  }

  function card(item) {
    const notes = el("ul", {}, item.notifications.map((n) => el("li", {},
      `${n.event} → ${n.receiver}: ${n.status}, ${n.attempts} attempt(s)`,
      n.sent_at ? ` · sent ${TTFT.when(n.sent_at)}` : "",
      n.last_error ? el("span", { class: "error" }, ` · ${n.last_error}`) : "",
      n.deliveries.length ? el("span", { class: "muted" }, " · " + n.deliveries.map((d) =>
        `${d.outcome}${d.http_status ? " " + d.http_status : ""}${d.duration_ms !== null ? ` (${ms(d.duration_ms)} ms)` : ""}`).join(", ")) : "")));
    return el("section", { class: "incident", id: `incident-${item.id}`, "data-incident": item.id },
      el("h3", {}, el("span", { class: `status status-${item.severity}` }, item.severity), " ",
        el("a", { href: seriesHref(item) }, `${item.target} · ${item.prompt} · ${item.location}`), ` ${item.kind}`),
      el("p", {}, `opened ${TTFT.when(item.opened_at)}`, item.resolved_at ? `, resolved ${TTFT.when(item.resolved_at)}` : ", still open",
        ` · ${TTFT.duration(item.duration_s)}`,
        el("span", { class: "figures" }, TTFT.incidentFigures(item)),
        item.error ? ` · error ${item.error}` : ""),
      item.notifications.length ? notes : item.group ? null : el("p", { class: "muted" }, "no notifications"),
      groupNote(item));
  }

  // One page per outage: a member's notifications went out under the group's lead incident.
  function groupNote(item) {
    const g = item.group;
    if (!g) return null;
    if (g.lead) return el("p", { class: "muted group" }, `notified for its group of ${g.members} incidents`);
    const sent = g.notifications.filter((n) => n.status === "sent");
    const what = g.notifications.length
      ? g.notifications.map((n) => `${n.event} → ${n.receiver}: ${n.status}`).join(", ")
      : "nothing sent yet";
    return el("p", { class: "group" },
      sent.length ? "notified as part of its group" : "part of a group", ` of ${g.members} incidents (${what}): see `,
      el("a", { href: `#incident-${g.lead_incident_id}`, "data-lead": g.lead_incident_id }, "the group's lead incident"));
  }

  load();
})();
