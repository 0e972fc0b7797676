// The dashboard's pages, chosen by the address: experiments, one experiment,
// one trial, queues, nodes and the cluster. Each polls the JSON API and
// redraws in place. Panels that read another part's endpoint (alerts,
// telemetry, the cost report) say so quietly when this head does not serve it.
"use strict";

(function () {
  const { el, fill, api, poll, num, table, chart, link, section, facts } = XP;
  const main = document.getElementById("main");
  const POLL_MS = 3000;

  // Metric values may be numbers or, when not finite, "NaN"/"Infinity" text.
  const value = (v) => (typeof v === "number" ? v : v === undefined || v === null ? null : String(v));
  const sortable = (v) => (typeof v === "number" ? v : null);

  async function experimentsPage() {
    fill(main, el("h1", {}, "Experiments"));
    const filter = el("input", { type: "search", placeholder: "filter by id, name, team or state", size: 40, id: "filter" });
    main.append(el("div", { class: "controls" }, filter));
    const holder = el("div", { class: "panel", id: "experiments" });
    main.append(holder);
    const view = { sort: 7, desc: true };
    let items = [];
    const draw = () => {
      const wanted = filter.value.trim().toLowerCase();
      const rows = items.filter((e) => !wanted || [e.id, e.name, e.team, e.state].some((f) => String(f).toLowerCase().includes(wanted)));
      const counts = (e) => Object.entries(e.counts || {}).map(([state, n]) => n + " " + state).join(", ");
      fill(holder, table([
        { title: "Experiment", key: (e) => e.id, cell: (e) => link("/experiments/" + encodeURIComponent(e.id), e.id), class: "mono" },
        { title: "Name", key: (e) => e.name, cell: (e) => e.name },
        { title: "Team", key: (e) => e.team, cell: (e) => e.team },
        { title: "State", key: (e) => e.state, cell: (e) => XP.state(e.state) },
        { title: "Trials", key: (e) => e.trial_count, cell: (e) => [num(e.trial_count), " ", el("span", { class: "muted" }, counts(e))] },
        { title: "Best", key: (e) => (e.best ? sortable(e.best.value) : null), num: true,
          cell: (e) => (e.best ? [num(value(e.best.value)), " ", el("span", { class: "muted" }, (e.metric || "") + " " + (e.mode || ""))] : "—") },
        { title: "GPU-hours", key: (e) => e.gpu_hours, num: true, cell: (e) => num(e.gpu_hours, 2) },
        { title: "Age", key: (e) => e.submitted_at_ms, cell: (e) => XP.age(e.submitted_at_ms) },
        { title: "Cost", key: (e) => e.cost, num: true, cell: (e) => num(e.cost, 2) },
      ], rows, view, draw));
    };
    filter.addEventListener("input", draw);
    // Pipelines, where this head runs them: each stage and the experiment it ran.
    const pipelines = el("div", { id: "pipelines" });
    main.append(pipelines);
    const drawPipelines = (answer) => {
      const list = (answer && answer.items) || [];
      if (!list.length) { fill(pipelines); return; }
      const stage = (s) => el("div", {}, s.name + " ", el("span", { class: "muted" }, "(" + XP.json(s.state).replace(/"/g, "") + (s.critical ? ", critical" : "") + ")"),
        s.experiment ? [" ", link("/experiments/" + encodeURIComponent(s.experiment), s.experiment)] : null);
      fill(pipelines, el("h2", {}, "Pipelines"), el("div", { class: "panel" }, table([
        { title: "Pipeline", cell: (p) => "p" + p.id },
        { title: "Name", cell: (p) => p.name },
        { title: "Team", cell: (p) => p.team },
        { title: "State", cell: (p) => XP.state(String(p.state)) },
        { title: "Stages", cell: (p) => (p.stages || []).map(stage) },
        { title: "Remaining", cell: (p) => (p.remaining_s === null || p.remaining_s === undefined ? "—" : XP.duration(1000 * p.remaining_s)) },
        { title: "Age", cell: (p) => XP.age(p.submitted_at) },
      ], list.slice(0, 100))));
    };
    let tick = 0;
    poll(async () => {
      const page = await api("/api/experiments?limit=1000");
      items = page.items;
      draw();
      if (tick % 3 === 0) drawPipelines(await api("/api/pipelines", true));
      tick += 1;
    }, POLL_MS);
  }

  async function experimentPage(id) {
    const base = "/api/experiments/" + encodeURIComponent(id);
    const title = el("h1", { id: "experiment-id" }, id);
    const summary = el("div");
    fill(main, title, summary);
    const alerts = section(main, "Alerts", "…");
    const trialsPanel = section(main, "Trials", "");
    const curveControls = el("div", { class: "controls" });
    const curves = el("div", { class: "chart", id: "curves" });
    section(main, "Learning curves", [curveControls, curves]);
    const grid = el("div", { class: "grid" });
    main.append(grid);
    const search = el("div", { class: "chart", id: "search" });
    const paramSelect = el("select", { id: "search-param" });
    const best = el("div", { class: "chart small", id: "best-vs-gpu-hours" });
    const bestNote = el("p", { class: "muted" });
    grid.append(el("div", {}, el("h2", {}, "Search: a parameter against the metric"), el("div", { class: "panel" }, el("div", { class: "controls" }, el("label", {}, "parameter ", paramSelect)), search)));
    grid.append(el("div", {}, el("h2", {}, "Best so far against GPU-hours"), el("div", { class: "panel" }, bestNote, best)));
    const replicates = section(main, "Replicates per configuration", "…");

    const state = { sort: "id", states: "", cursor: null, cursors: [], metric: null, smoothing: 0.6, series: 10, metrics: new Set() };
    const metricSelect = el("select", { id: "curve-metric" });
    const smoothing = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: state.smoothing, id: "smoothing" });
    const smoothingText = el("span", {}, String(state.smoothing));
    const seriesSelect = el("select", { id: "curve-series" }, [5, 10, 20, 50].map((n) => el("option", { value: n, selected: n === state.series }, n + " best trials")));
    fill(curveControls, el("label", {}, "metric ", metricSelect), el("label", {}, "EMA smoothing ", smoothing, " ", smoothingText), seriesSelect);
    metricSelect.addEventListener("change", () => { state.metric = metricSelect.value; drawCurves(); });
    smoothing.addEventListener("input", () => { state.smoothing = Number(smoothing.value); fill(smoothingText, smoothing.value); });
    smoothing.addEventListener("change", () => drawCurves());
    seriesSelect.addEventListener("change", () => { state.series = Number(seriesSelect.value); drawCurves(); });

    let experiment = null;
    // The cost report's totals, for a summary that carries none.
    let reported = {};
    const drawSummary = () => {
      const e = Object.assign({}, experiment);
      if (e.gpu_hours === undefined) e.gpu_hours = reported.gpu_hours;
      if (e.cost === undefined) e.cost = reported.cost;
      fill(summary, facts([
        ["name", e.name], ["team", e.team], ["state", e.state], ["trials", num(e.trial_count)],
        ["metric", (e.metric || "—") + " (" + e.mode + ")"],
        ["best", e.best ? num(value(e.best.value)) + " (" + e.best.trial + ")" : "—"],
        ["GPU-hours", num(e.gpu_hours, 2)], ["cost", num(e.cost, 2)], ["age", XP.age(e.submitted_at_ms)],
      ]), el("p", { class: "muted" }, Object.entries(e.counts || {}).map(([s, n]) => n + " " + s).join(" · ")));
    };

    const stateSelect = el("select", { id: "trial-state" }, ["", "queued", "running", "succeeded", "failed", "stopped", "cancelled"].map((s) => el("option", { value: s }, s || "any state")));
    const sortSelect = el("select", { id: "trial-sort" }, [["id", "id ↑"], ["-id", "id ↓"], ["metric", "metric ↑"], ["-metric", "metric ↓"]].map(([v, t]) => el("option", { value: v }, t)));
    const pageInfo = el("span", { class: "muted" });
    const next = el("button", {}, "next page");
    const first = el("button", {}, "first page");
    const tableHolder = el("div", { id: "trials" });
    fill(trialsPanel, el("div", { class: "controls" }, stateSelect, sortSelect, first, next, pageInfo), tableHolder);
    stateSelect.addEventListener("change", () => { state.states = stateSelect.value; state.cursor = null; drawTrials(); });
    sortSelect.addEventListener("change", () => {
      state.sort = sortSelect.value;
      Object.assign(trialView, { sort: state.sort.endsWith("metric") ? 3 : 0, desc: state.sort.startsWith("-") });
      state.cursor = null;
      drawTrials();
    });
    let nextCursor = null;
    next.addEventListener("click", () => { if (nextCursor) { state.cursor = nextCursor; drawTrials(); } });
    first.addEventListener("click", () => { state.cursor = null; drawTrials(); });

    // The trials table: the Trial and metric columns sort the whole
    // experiment on the head (and page through it); the other columns sort the
    // page shown.
    const trialView = { sort: 0, desc: false };
    let trialItems = [];
    function renderTrials() {
      const metric = experiment && experiment.metric;
      const metricOf = (t) => (metric && t.metrics ? t.metrics[metric] : null);
      fill(tableHolder, table([
        { title: "Trial", server: true, key: (t) => t.id, cell: (t) => link("/trials/" + encodeURIComponent(t.id), t.id.replace(/^.*-t/, "t")), class: "mono" },
        { title: "State", key: (t) => t.state, cell: (t) => [XP.state(t.state), t.waiting ? el("div", { class: "muted" }, t.waiting) : null] },
        { title: "Config", key: (t) => XP.json(t.config), cell: (t) => XP.json(t.config), class: "config" },
        { title: metric || "metric", server: true, key: (t) => sortable(metricOf(t)), num: true, cell: (t) => num(value(metricOf(t))) },
        { title: "Step", key: (t) => t.last_step, num: true, cell: (t) => num(t.last_step) },
        { title: "Attempts", key: (t) => t.attempts.length, num: true, cell: (t) => num(t.attempts.length) },
        { title: "GPU-hours", key: (t) => t.gpu_hours, num: true, cell: (t) => num(t.gpu_hours, 3) },
        { title: "Reason", cell: (t) => t.reason || "" },
      ], trialItems, trialView, () => {
        const server = { 0: "id", 3: "metric" }[trialView.sort];
        if (server) {
          state.sort = (trialView.desc ? "-" : "") + server;
          sortSelect.value = state.sort;
          state.cursor = null;
          drawTrials();
        } else {
          renderTrials();
        }
      }));
    }
    async function drawTrials() {
      let query = "?limit=100&sort=" + encodeURIComponent(state.sort);
      if (state.states) query += "&state=" + encodeURIComponent(state.states);
      if (state.cursor) query += "&cursor=" + encodeURIComponent(state.cursor);
      const page = await api(base + "/trials" + query);
      nextCursor = page.next_cursor;
      next.disabled = !nextCursor;
      fill(pageInfo, page.items.length + " of " + page.total + " trials");
      for (const trial of page.items) Object.keys(trial.metrics || {}).forEach((m) => state.metrics.add(m));
      trialItems = page.items;
      renderTrials();
    }

    async function drawCurves() {
      const metric = state.metric || (experiment && experiment.metric);
      if (!metric) { fill(curves, el("p", { class: "muted" }, "this experiment names no metric")); return; }
      const answer = await api(base + "/curves?metric=" + encodeURIComponent(metric) + "&series=" + state.series + "&smoothing=" + state.smoothing);
      const traces = answer.series.map((s) => ({
        type: "scatter", mode: "lines", name: XP.configLabel(s.trial, s.config), x: s.steps,
        y: s.smoothed || s.values, customdata: s.values,
        hovertemplate: "%{fullData.name}<br>step %{x}<br>" + "smoothed %{y:.4g} (raw %{customdata:.4g})<extra></extra>",
      }));
      const name = XP.plotText(metric);
      chart(curves, traces, { title: { text: name }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: name } } });
    }

    // A parameter against the metric, one point per trial (SVG, so it draws
    // without WebGL), from the best 1,000 trials that reported.
    let searchTrials = [];
    paramSelect.addEventListener("change", () => plotSearch());
    function plotSearch() {
      const metric = experiment.metric;
      const name = paramSelect.value;
      const trials = searchTrials.filter((t) => t.config && name in t.config);
      const label = (v) => (typeof v === "number" ? v : XP.plotText(XP.json(v)));
      chart(search, [{
        type: "scatter", mode: "markers", name: metric,
        x: trials.map((t) => label(t.config[name])),
        y: trials.map((t) => sortable(t.metrics ? t.metrics[metric] : null)),
        text: trials.map((t) => XP.plotText(t.id.replace(/^.*-t/, "t") + " " + XP.json(t.config))),
        hovertemplate: "%{text}<br>" + "%{y:.4g}<extra></extra>",
        marker: { size: 7, opacity: 0.7 },
      }], { xaxis: { title: { text: XP.plotText(name) } }, yaxis: { title: { text: XP.plotText(metric) } }, showlegend: false });
    }
    async function drawSearch() {
      const metric = experiment.metric;
      if (!metric) { fill(search, el("p", { class: "muted" }, "this experiment names no metric")); return; }
      const page = await api(base + "/trials?limit=1000&sort=" + (experiment.mode === "max" ? "-metric" : "metric") + "&state=succeeded,stopped,running");
      searchTrials = page.items.filter((t) => t.config && typeof t.config === "object" && t.metrics && metric in t.metrics);
      const names = [...new Set(searchTrials.flatMap((t) => Object.keys(t.config)))].filter((n) => n !== "seed");
      if (!names.length) { fill(search, el("p", { class: "muted" }, "no trial has reported " + metric + " yet")); return; }
      if (names.join() !== [...paramSelect.options].map((o) => o.value).join()) {
        // A numeric parameter first, when there is one.
        const numeric = names.find((n) => searchTrials.every((t) => !(n in t.config) || typeof t.config[n] === "number"));
        const chosen = names.includes(paramSelect.value) ? paramSelect.value : numeric || names[0];
        fill(paramSelect, names.map((n) => el("option", { value: n, selected: n === chosen }, n)));
        paramSelect.value = chosen;
      }
      if (search.firstChild && search.firstChild.tagName === "P") fill(search);
      plotSearch();
    }

    async function drawReplicates() {
      if (!experiment.metric) { fill(replicates, el("p", { class: "muted" }, "this experiment names no metric")); return; }
      const answer = await api(base + "/replicates");
      fill(replicates, el("p", { class: "muted" }, answer.total_groups + " configurations; mean and Student-t 95% interval of each one's finished replicates, best first"),
        table([
          { title: "Config", cell: (g) => XP.json(g.config), class: "config" },
          { title: "Trials", num: true, cell: (g) => num(g.trials) },
          { title: "Finished", num: true, cell: (g) => num(g.n) },
          { title: "Mean " + answer.metric, num: true, cell: (g) => num(g.mean) },
          { title: "Std dev", num: true, cell: (g) => num(g.std_dev) },
          { title: "95% CI", num: true, cell: (g) => (g.ci95_low === null ? "—" : "[" + num(g.ci95_low) + ", " + num(g.ci95_high) + "]") },
          { title: "First trial", cell: (g) => (g.first_trial ? link("/trials/" + encodeURIComponent(g.first_trial), g.first_trial.replace(/^.*-t/, "t")) : "—") },
        ], answer.groups.slice(0, 50)));
    }

    async function drawBest() {
      const report = await api("/api/report?experiment=" + encodeURIComponent(id), true);
      const returns = report && (report.returns || []).find((r) => r.experiment === id);
      const points = (report && report.best_vs_gpu_hours) || (returns && returns.best_vs_gpu_hours);
      if (report) reported = report;
      if (!points) { fill(bestNote, "The cost report is not available on this head."); return; }
      fill(bestNote, facts([
        ["GPU-hours", num(report.gpu_hours, 3)], ["lost", num(report.gpu_hours_lost, 3)], ["cost", num(report.cost, 2)],
        ["last quarter's gain", num(report.last_quarter_gain !== undefined ? report.last_quarter_gain : returns && returns.last_quarter_gain)],
        ["ROI", report.roi_percent === null || report.roi_percent === undefined ? "—" : num(report.roi_percent, 1) + "%"],
      ]));
      chart(best, [{ type: "scatter", mode: "lines+markers", line: { shape: "hv" }, x: points.map((p) => p.gpu_hours), y: points.map((p) => p.best), name: "best so far" }],
        { xaxis: { title: { text: "cumulative GPU-hours" } }, yaxis: { title: { text: XP.plotText(experiment.metric || "best") } }, showlegend: false });
    }

    async function drawAlerts() {
      const answer = await api("/api/alerts?experiment=" + encodeURIComponent(id), true);
      if (!answer) { fill(alerts, el("span", { class: "muted" }, "Alerts are not available on this head.")); return; }
      const items = answer.items || answer.alerts || (Array.isArray(answer) ? answer : []);
      if (!items.length) { fill(alerts, el("span", { class: "muted" }, "none")); return; }
      fill(alerts, table([
        { title: "When", cell: (a) => XP.time(a.at_ms) },
        { title: "Trial", cell: (a) => link("/trials/" + encodeURIComponent(a.trial), a.trial) },
        { title: "Rule", cell: (a) => a.rule + " (" + a.kind + ")" },
        { title: "Message", cell: (a) => a.message },
        { title: "Delivery", cell: (a) => a.delivery },
      ], items.slice(0, 50)));
    }

    let slowTick = 0;
    poll(async () => {
      experiment = await api(base);
      drawSummary();
      await drawTrials();
      if (!state.metric && experiment.metric) {
        state.metric = experiment.metric;
      }
      const names = [...new Set([experiment.metric, ...state.metrics].filter(Boolean))];
      if (names.join() !== [...metricSelect.options].map((o) => o.value).join()) {
        fill(metricSelect, names.map((n) => el("option", { value: n, selected: n === state.metric }, n)));
      }
      await drawCurves();
      // The heavier panels refresh every fourth tick.
      if (slowTick % 4 === 0) {
        await Promise.all([drawSearch(), drawReplicates(), drawBest(), drawAlerts()]);
      }
      slowTick += 1;
    }, POLL_MS);
  }

  async function trialPage(id) {
    const base = "/api/trials/" + encodeURIComponent(id);
    const summary = el("div");
    fill(main, el("h1", { id: "trial-id" }, id), summary);
    const curves = el("div", { class: "grid", id: "trial-curves" });
    section(main, "Metrics", curves);
    const telemetry = el("div", { class: "grid", id: "telemetry" });
    const telemetryNote = el("p", { class: "muted" });
    section(main, "Workers: CPU, memory and GPU", [telemetryNote, telemetry]);
    const logControls = el("div", { class: "controls" });
    const log = el("pre", { class: "log", id: "log" });
    section(main, "Log", [logControls, log]);
    const attempts = section(main, "Attempts", "…");
    const checkpoints = section(main, "Checkpoints", "…");
    const events = section(main, "Events", "…");
    const alerts = section(main, "Alerts", "…");
    const charts = new Map();
    const rankSelect = el("select", { id: "log-rank" });
    fill(logControls, el("label", {}, "rank ", rankSelect), el("span", { class: "muted" }, "following the log as it grows"));
    const logState = { rank: 0, offset: 0, text: "", busy: false };
    rankSelect.addEventListener("change", () => {
      Object.assign(logState, { rank: Number(rankSelect.value), offset: 0, text: "" });
      fill(log);
    });
    const MAX_LOG_CHARS = 200000;

    async function followLog() {
      // Reads until caught up (a long log comes in 256 KiB pieces), keeping the tail.
      for (let reads = 0; reads < 16; reads += 1) {
        const answer = await api(base + "/logs?rank=" + logState.rank + "&offset=" + logState.offset + "&max_bytes=262144", true);
        if (!answer) { if (!logState.text) fill(log, "no output recorded yet"); return; }
        logState.offset = answer.next_offset;
        if (answer.data) {
          logState.text = (logState.text + answer.data).slice(-MAX_LOG_CHARS);
          const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
          fill(log, logState.text);
          if (atBottom) log.scrollTop = log.scrollHeight;
        }
        if (answer.data.length < 200000) return;
      }
    }

    const chartFor = (key, title) => {
      if (!charts.has(key)) {
        const node = el("div", { class: "chart small" });
        charts.set(key, node);
        (key.startsWith("m:") ? curves : telemetry).append(el("div", { class: "panel" }, node));
      }
      return charts.get(key);
    };

    async function drawMetrics(trial) {
      const names = Object.keys(trial.metrics || {}).slice(0, 8);
      if (!names.length) { if (!curves.childElementCount) fill(curves, el("p", { class: "muted" }, "no metrics reported yet")); return; }
      if (curves.firstChild && curves.firstChild.tagName === "P") fill(curves);
      await Promise.all(names.map(async (name) => {
        const answer = await api("/api/experiments/" + encodeURIComponent(trial.experiment) + "/curves?trials=" + encodeURIComponent(id) + "&metric=" + encodeURIComponent(name), true);
        if (!answer) return;
        const traces = answer.series.map((s) => ({ type: "scatter", mode: "lines", name: XP.plotText(name), x: s.steps, y: s.values }));
        chart(chartFor("m:" + name), traces, { title: { text: XP.plotText(name) }, showlegend: false, xaxis: { title: { text: "step" } } });
      }));
    }

    async function drawTelemetry() {
      const answer = await api(base + "/telemetry", true);
      if (!answer) { fill(telemetryNote, "Telemetry is not available on this head."); return; }
      const workers = answer.workers || [];
      fill(telemetryNote, workers.length ? "" : "no samples yet");
      const MIB = 1024 * 1024;
      const fields = [["cpu_cores", "CPU cores", 1], ["rss_bytes", "resident memory (MiB)", MIB], ["gpu_util", "GPU utilisation (%)", 1],
        ["gpu_mem_bytes", "GPU memory (MiB)", MIB], ["gpu_power_w", "GPU power (W)", 1]];
      for (const [field, label, unit] of fields) {
        const traces = workers.map((w) => ({
          type: "scatter", mode: "lines+markers", name: "rank " + w.rank,
          x: w.series.filter((p) => p[field] !== undefined).map((p) => new Date(p.t_ms)),
          y: w.series.filter((p) => p[field] !== undefined).map((p) => p[field] / unit),
        })).filter((t) => t.y.length);
        if (traces.length) chart(chartFor("t:" + field), traces, { title: { text: label } });
      }
    }

    async function drawAlerts(trial) {
      const answer = await api("/api/alerts?experiment=" + encodeURIComponent(trial.experiment), true);
      if (!answer) { fill(alerts, el("span", { class: "muted" }, "Alerts are not available on this head.")); return; }
      const items = (answer.items || answer.alerts || (Array.isArray(answer) ? answer : [])).filter((a) => a.trial === id);
      fill(alerts, items.length ? table([
        { title: "When", cell: (a) => XP.time(a.at_ms) },
        { title: "Rule", cell: (a) => a.rule + " (" + a.kind + ")" },
        { title: "Message", cell: (a) => a.message },
        { title: "Delivery", cell: (a) => a.delivery },
      ], items) : el("span", { class: "muted" }, "none"));
    }

    let tick = 0;
    poll(async () => {
      const trial = await api(base);
      fill(summary, facts([
        ["experiment", link("/experiments/" + encodeURIComponent(trial.experiment), trial.experiment)],
        ["state", trial.state], ["config", XP.json(trial.config)], ["step", num(trial.last_step)],
        [trial.metric || "metric", num(value(trial.metric && trial.metrics ? trial.metrics[trial.metric] : null))],
        ["GPU-hours", num(trial.gpu_hours !== undefined ? trial.gpu_hours : trial.allocated_gpu_hours, 3)],
        ["reason", trial.reason || trial.waiting || "—"],
      ]));
      if (rankSelect.options.length !== Math.max(1, trial.world_size)) {
        fill(rankSelect, Array.from({ length: Math.max(1, trial.world_size) }, (_, r) => el("option", { value: r, selected: r === logState.rank }, String(r))));
      }
      fill(attempts, table([
        { title: "Attempt", num: true, cell: (a) => a.number },
        { title: "Nodes", cell: (a) => a.nodes.join(", "), class: "mono" },
        { title: "Placed", cell: (a) => XP.time(a.placed_at_ms) },
        { title: "Running", cell: (a) => XP.time(a.running_at_ms) },
        { title: "Ended", cell: (a) => XP.time(a.ended_at_ms) },
        { title: "Outcome", cell: (a) => a.outcome || "—" },
        { title: "Resumed from", cell: (a) => (a.resumed_from ? "step " + a.resumed_from.step + " of attempt " + a.resumed_from.attempt : "the start") },
      ], trial.attempts));
      fill(checkpoints, trial.checkpoints.length ? table([
        { title: "Step", num: true, cell: (c) => num(c.step) },
        { title: "Attempt", num: true, cell: (c) => c.attempt },
        { title: "When", cell: (c) => XP.time(c.at_ms) },
        { title: "Size", num: true, cell: (c) => XP.bytes(c.bytes) },
        { title: "Metric", num: true, cell: (c) => num(value(c.metric)) },
        { title: "Copies", cell: (c) => (c.replicated ? c.replicas.length + " nodes" : c.unreplicated || "one copy") },
      ], trial.checkpoints) : el("span", { class: "muted" }, "none kept"));
      fill(events, table([
        { title: "When", cell: (e) => XP.time(e.at_ms) },
        { title: "State", cell: (e) => XP.state(e.state) },
        { title: "Attempt", num: true, cell: (e) => e.attempt },
        { title: "Why", cell: (e) => e.reason },
      ], trial.events));
      await Promise.all([drawMetrics(trial), followLog(), tick % 3 === 0 ? drawTelemetry() : null, tick % 3 === 0 ? drawAlerts(trial) : null]);
      tick += 1;
    }, POLL_MS);
  }

  async function queuesPage() {
    fill(main, el("h1", {}, "Queues"));
    const holder = section(main, "Usage, quota and fair share", "…");
    const waiting = section(main, "Waiting trials and why", "…");
    const approvals = section(main, "Preemptions waiting for an admin's approval", "…");
    const amount = (a, gpus) => (a ? [a.gpu !== undefined && a.gpu !== null ? num(a.gpu, 2) + " GPU" : null, a.cpu !== undefined && a.cpu !== null ? num(a.cpu, 1) + " CPU" : null,
      a.memory_bytes !== undefined && a.memory_bytes !== null ? XP.bytes(a.memory_bytes) : null].filter(Boolean).join(", ") || (gpus ? "unlimited" : "—") : "—");
    const view = {};
    let items = [];
    const draw = () => fill(holder, table([
      { title: "Queue", key: (q) => q.name, cell: (q) => q.name },
      { title: "Team", key: (q) => q.team, cell: (q) => q.team || "—" },
      { title: "Cohort", key: (q) => q.cohort, cell: (q) => q.cohort || "—" },
      { title: "Weight", key: (q) => q.weight, num: true, cell: (q) => num(q.weight) },
      { title: "Usage", cell: (q) => amount(q.usage) },
      { title: "Quota", cell: (q) => amount(q.quota, true) },
      { title: "Borrowed", cell: (q) => amount(q.borrowed) },
      { title: "Lent", cell: (q) => amount(q.lent) },
      { title: "Running", key: (q) => q.running, num: true, cell: (q) => num(q.running) },
      { title: "Pending", key: (q) => q.pending, num: true, cell: (q) => num(q.pending) },
      { title: "Fair share", key: (q) => q.fair_share, num: true, cell: (q) => num(q.fair_share, 3) },
      { title: "Leases", cell: (q) => Object.entries(q.leases || {}).map(([name, held]) =>
        el("div", {}, name + ": " + held + (q.lease_quota && q.lease_quota[name] !== undefined ? " / " + q.lease_quota[name] : ""))) },
    ], items, view, draw));
    poll(async () => {
      items = (await api("/api/queues?limit=1000")).items;
      draw();
      const answer = await api("/api/waiting?limit=200");
      fill(waiting, answer.items.length ? [el("p", { class: "muted" }, answer.items.length + " of " + answer.total + " waiting trials, longest waiting first"), table([
        { title: "Trial", cell: (t) => link("/trials/" + encodeURIComponent(t.trial), t.trial), class: "mono" },
        { title: "Queue", cell: (t) => t.queue },
        { title: "Waiting", cell: (t) => XP.age(t.queued_at_ms) },
        { title: "Why", cell: (t) => t.waiting },
      ], answer.items)] : el("span", { class: "muted" }, "no trial is waiting"));
      const leases = await api("/api/leases");
      fill(approvals, leases.approvals.length ? [el("p", { class: "muted" }, "xp admin approve|deny ID --why ..."), table([
        { title: "Request", cell: (a) => String(a.id), class: "mono" },
        { title: "Stop", cell: (a) => link("/trials/" + encodeURIComponent(a.victim), a.victim), class: "mono" },
        { title: "For", cell: (a) => link("/trials/" + encodeURIComponent(a.claimant), a.claimant), class: "mono" },
        { title: "Why", cell: (a) => a.why },
        { title: "Asked", cell: (a) => XP.age(a.at_ms) },
      ], leases.approvals)] : el("span", { class: "muted" }, "no preemption waits for approval"));
    }, POLL_MS);
  }

  async function nodesPage() {
    fill(main, el("h1", {}, "Nodes"));
    const holder = section(main, "Nodes", "…");
    const slots = section(main, "GPU slots", "…");
    const view = {};
    let items = [];
    const draw = () => fill(holder, table([
      { title: "Node", key: (n) => n.name, cell: (n) => [n.name, el("div", { class: "muted mono" }, n.id)] },
      { title: "Address", key: (n) => n.address, cell: (n) => n.address },
      { title: "State", key: (n) => n.state, cell: (n) => XP.state(n.state) },
      { title: "Last heartbeat", key: (n) => n.last_seen_ms, cell: (n) => XP.age(n.last_seen_ms) + " ago" },
      { title: "GPUs free", key: (n) => n.free_gpus, num: true, cell: (n) => num(n.free_gpus) + " / " + num(n.gpus) },
      { title: "CPUs free", key: (n) => n.free_cpus, num: true, cell: (n) => num(n.free_cpus, 1) + " / " + num(n.cpus, 1) },
      { title: "Memory free", key: (n) => n.free_memory_bytes, num: true, cell: (n) => XP.bytes(n.free_memory_bytes) + " / " + XP.bytes(n.memory_bytes) },
      { title: "Workers", key: (n) => n.running_workers, num: true, cell: (n) => num(n.running_workers) },
      { title: "Isolation", cell: (n) => n.isolation + ", " + n.limits },
    ], items, view, draw));
    poll(async () => {
      items = (await api("/api/nodes?limit=1000")).items;
      draw();
      const telemetry = new Map(items.map((n) => [n.id, new Map((n.gpu_telemetry || []).map((g) => [g.index, g]))]));
      const gpus = await api("/api/gpus");
      const rows = gpus.nodes.filter((n) => n.gpus.length);
      fill(slots, rows.length ? table([
        { title: "Node", cell: (n) => n.name },
        { title: "GPUs", cell: (n) => n.gpus.map((g) => {
          const sample = (telemetry.get(n.id) || new Map()).get(g.index);
          const holders = g.workers.map((w) => (w.trial ? [link("/trials/" + encodeURIComponent(w.trial), w.trial.replace(/^.*-t/, "t")), " r" + w.rank] : ["another team's"]));
          return el("span", { class: "slot" + (g.busy_milli ? " busy" : ""), title: g.model },
            "GPU " + g.index + ": ", holders.length ? holders : "free",
            sample ? el("div", { class: "muted" }, num(sample.util, 0) + "% · " + XP.bytes(sample.memory_used_bytes)) : null);
        }) },
      ], rows) : el("span", { class: "muted" }, "no node has GPUs"));
    }, POLL_MS);
  }

  async function clusterPage() {
    fill(main, el("h1", {}, "Cluster"));
    const note = el("p", { class: "muted" });
    const report = el("div", { id: "report" });
    main.append(note, report);
    const grid = el("div", { class: "grid" });
    main.append(grid);
    const make = (id) => { const node = el("div", { class: "chart small", id }); grid.append(el("div", { class: "panel" }, node)); return node; };
    const util = make("utilization");
    const throughput = make("throughput");
    const time = make("time-in-system");
    const count = make("in-system");
    const teams = make("gpu-hours-by-team");
    poll(async () => {
      const h = await api("/api/cluster?buckets=60");
      const x = h.buckets.map((b) => new Date(b.start_ms));
      fill(note, "From " + XP.time(h.since_ms) + ", in buckets of " + XP.duration(h.bucket_ms) + "; " + num(h.capacity_gpus) + " GPUs on ready nodes now.");
      const line = (name, ys) => ({ type: "scatter", mode: "lines", line: { shape: "hv" }, name, x, y: ys });
      chart(util, [line("allocated GPUs", h.buckets.map((b) => b.allocated_gpus)), Object.assign(line("utilisation", h.buckets.map((b) => b.utilization)), { yaxis: "y2" })],
        { title: { text: "GPUs allocated and utilisation" }, margin: { l: 55, r: 55, t: 30, b: 40 }, yaxis2: { overlaying: "y", side: "right", range: [0, 1], tickformat: ".0%" } });
      chart(throughput, [line("trials finished per hour", h.buckets.map((b) => b.throughput_per_hour))], { title: { text: "Throughput (trials per hour)" } });
      chart(time, [Object.assign(line("mean time in system (s)", h.buckets.map((b) => b.mean_time_in_system_s)), { mode: "lines+markers", connectgaps: true })], { title: { text: "Time in system (s)" } });
      chart(count, [line("trials in system", h.buckets.map((b) => b.in_system))], { title: { text: "Number in system" } });
      const byTeam = Object.entries(h.gpu_hours_by_team || {});
      chart(teams, [{ type: "bar", x: byTeam.map(([t]) => XP.plotText(t)), y: byTeam.map(([, v]) => v), name: "GPU-hours" }], { title: { text: "GPU-hours by team" }, showlegend: false });
      // The cost report of the last week, where this head serves one.
      const r = await api("/api/report?since=7d", true);
      fill(report, r ? [el("h2", {}, "Last 7 days (cost report)"), facts([
        ["GPU-hours", num(r.gpu_hours, 2)], ["lost", num(r.gpu_hours_lost, 2)], ["cost", num(r.cost, 2)],
        ["utilisation", r.utilization === null || r.utilization === undefined ? "—" : num(100 * r.utilization, 1) + "%"],
        ["throughput", num(r.throughput_per_hour, 2) + " trials/h"], ["W", num(r.mean_time_in_system_s, 1) + " s"],
        ["L", num(r.mean_in_system, 2)], ["L / λW", num(r.littles_law_ratio, 3)],
      ])] : el("p", { class: "muted" }, "The cost report is not available on this head."));
    }, 5000);
  }

  async function route() {
    const path = window.location.pathname;
    api("/api/whoami", true).then((me) => { if (me) fill(document.getElementById("user"), me.user); }).catch(() => {});
    let match;
    if (path === "/") return experimentsPage();
    if ((match = path.match(/^\/experiments\/([^/]+)$/))) return experimentPage(decodeURIComponent(match[1]));
    if ((match = path.match(/^\/trials\/([^/]+)$/))) return trialPage(decodeURIComponent(match[1]));
    if (path === "/queues") return queuesPage();
    if (path === "/nodes") return nodesPage();
    if (path === "/cluster") return clusterPage();
    fill(main, el("p", {}, "No such page."));
  }

  route();
})();
