/* crawlctl dashboard: live updates (server-sent events), charts (uPlot), actions.
   The server renders every table and number (escaped); this script only swaps
   the fragments it sends, draws the samples and posts the confirmed actions. */
(function () {
  "use strict";
  const main = document.getElementById("main");
  if (!main || !main.dataset.events) return;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const windowS = Number(main.dataset.window) || 600;
  const live = document.getElementById("live");
  // [unix s, queued, inflight, delayed, dead, invalid, pages/s, items/s]
  const samples = JSON.parse(document.getElementById("samples").textContent);
  const FRONTIER = [["queued", "#0b57a8"], ["in flight", "#146c2e"], ["delayed", "#b35900"],
                    ["dead", "#a3161b"], ["invalid", "#6b21a8"]];
  const RATES = [["pages/s", "#0b57a8"], ["items/s", "#146c2e"]];
  const charts = [];
  const shown = new Map();

  // seconds between time labels: whole seconds to hours
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400];
  const hms = (t) => new Date(t * 1000).toISOString().slice(11, 19);

  function columns(from, count) {
    const data = [samples.map((s) => s[0])];
    for (let i = 0; i < count; i++) data.push(samples.map((s) => s[from + i]));
    return data;
  }

  function chart(id, series, from) {
    const el = document.getElementById(id);
    if (!el || typeof uPlot === "undefined") return;
    const axis = {stroke: "#1b1f24", grid: {stroke: "#e3e6ea"}, ticks: {stroke: "#c9ced4"}};
    const opts = {
      width: Math.max(300, el.clientWidth), height: 220,
      scales: {x: {time: true}},
      // Names only: a live legend shows "--" for every series until the
      // pointer is over the chart (the numbers are in the panels above).
      legend: {live: false},
      // dashes as well as colours: the series differ without colour vision too
      series: [{label: "time (UTC)"}].concat(series.map(([label, stroke], i) => (
        {label: label, stroke: stroke, width: 2, dash: [[], [8, 4], [2, 3], [12, 3, 2, 3], [4, 4]][i]}))),
      // Time as HH:MM:SS UTC (as the page's other times), whole seconds, at
      // least 90 px apart: uPlot's own labels for a short span read ":48.000"
      // and overlapped. The labels drawn are kept on the chart's element
      // (data-ticks): the canvas holds no text for a reader or a test.
      axes: [{...axis, space: 90, incrs: TIME_STEPS, values: (u, ticks) => {
        const labels = ticks.map(hms);
        el.dataset.ticks = labels.join(" ");
        return labels;
      }}, {...axis, size: 60}],
    };
    charts.push({plot: new uPlot(opts, columns(from, series.length), el), el, from,
                 count: series.length});
  }

  function redraw() {
    for (const c of charts) c.plot.setData(columns(c.from, c.count));
  }

  function addSample(sample) {
    if (!sample || (samples.length && samples[samples.length - 1][0] >= sample[0])) return;
    samples.push(sample);
    while (samples.length && samples[0][0] < sample[0] - windowS) samples.shift();
    redraw();
  }

  function apply(update) {
    for (const [name, html] of Object.entries(update.html || {})) {
      const el = document.getElementById("frag-" + name);
      if (el && shown.get(name) !== html) {
        el.innerHTML = html;   // rendered and escaped by the server
        shown.set(name, html);
      }
    }
    addSample(update.sample);
  }

  function connect() {
    const source = new EventSource(main.dataset.events);
    source.addEventListener("update", (ev) => {
      live.textContent = "live";
      live.className = "live on";
      apply(JSON.parse(ev.data));
    });
    source.onerror = () => {
      live.textContent = source.readyState === EventSource.CLOSED
        ? "disconnected: reload the page" : "reconnecting…";
      live.className = "live off";
    };
  }

  // Actions: a modal dialog confirms (Escape or Cancel: nothing happens).
  const dialog = document.getElementById("confirm");
  const result = document.getElementById("action-result");
  let pending = null;
  for (const button of document.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", () => {
      pending = button;
      document.getElementById("confirm-title").textContent = button.dataset.label + "?";
      document.getElementById("confirm-text").textContent = button.dataset.confirm;
      document.getElementById("confirm-ok").textContent = button.dataset.label;
      dialog.returnValue = "";
      dialog.showModal();
    });
  }
  dialog.addEventListener("close", () => {
    const button = pending;
    pending = null;
    if (!button) return;
    button.focus();   // the keyboard goes on where it was
    if (dialog.returnValue === "confirm") run(button.dataset.action, button.dataset.label);
    else result.textContent = button.dataset.label + ": cancelled";
  });

  async function run(name, label) {
    result.textContent = label + "…";
    try {
      const response = await fetch(main.dataset.actions + encodeURIComponent(name), {
        method: "POST", credentials: "same-origin", body: "{}",
        headers: {"X-CSRF-Token": csrf, "Content-Type": "application/json"},
      });
      const data = await response.json().catch(() => ({}));
      result.textContent = response.ok ? data.message
        : label + " failed: " + (data.error || response.status + " " + response.statusText);
    } catch (err) {
      result.textContent = label + " failed: " + err;
    }
  }

  chart("chart-frontier", FRONTIER, 1);
  chart("chart-rates", RATES, 6);
  window.addEventListener("resize", () => {
    for (const c of charts) c.plot.setSize({width: Math.max(300, c.el.clientWidth), height: 220});
  });
  connect();
})();
