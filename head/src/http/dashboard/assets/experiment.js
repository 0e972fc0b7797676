// The experiment page: its summary; its trials a page at a time with one
// column per parameter; 2 to 4 chosen trials side by side (configurations,
// outcomes, learning curves); learning curves of the best trials; a parameter
// against the metric (a log axis for log-distributed parameters, starting on
// the most important one); parameter importance by PED-ANOVA; parallel
// coordinates over the parameters and the metric, filterable by dragging
// along an axis; replicates, best so far against GPU-hours, and alerts.
"use strict";

(function () {
  const { el, fill, api, poll, num, table, chart, link, section, facts } = XP;
  const POLL_MS = 3000;
  const MAX_COMPARE = 4;

  // Metric values may be numbers or, when not finite, "NaN"/"Infinity" text.
  const value = (v) => (typeof v === "number" ? v : v === undefined || v === null ? null : String(v));
  const sortable = (v) => (typeof v === "number" ? v : null);
  const trialLink = (trial) => link("/trials/" + encodeURIComponent(trial), XP.shortTrial(trial));

  // The parameters a page of trials shows: the search space's, in its order,
  // then any other configuration key the trials carry (a replicate's seed).
  function parameterNames(space, trials) {
    const names = space.map((p) => p.name);
    for (const trial of trials) {
      for (const name of Object.keys(trial.config || {})) if (!names.includes(name)) names.push(name);
    }
    return names;
  }

  XP.experimentPage = function (main, id) {
    const base = "/api/experiments/" + encodeURIComponent(id);
    const page = {
      base, id, experiment: null, parameters: null, trials: [], searchTrials: [], userParam: null,
      selected: (XP.params().get("compare") || "").split(",").filter(Boolean).slice(0, MAX_COMPARE),
    };
    const summary = el("div");
    fill(main, el("h1", { id: "experiment-id" }, id), summary);
    const alerts = section(main, "Alerts", "…");
    const trials = trialsPanel(page, section(main, "Trials", ""));
    const compare = comparePanel(page, section(main, "Side by side", ""));
    const curves = curvesPanel(page, section(main, "Learning curves", ""));
    const grid = el("div", { class: "grid" });
    main.append(grid);
    const search = searchPanel(page, grid);
    const importance = importancePanel(page, grid);
    const parcoords = parcoordsPanel(page, section(main, "Parallel coordinates", ""));
    const lower = el("div", { class: "grid" });
    main.append(lower);
    const best = bestPanel(page, lower);
    const replicates = replicatesPanel(page, main);
    trials.onSelect = () => compare.draw();
    parcoords.onChoose = (ids) => { page.selected = ids.slice(0, MAX_COMPARE); trials.render(); compare.draw(); };

    let tick = 0;
    poll(async () => {
      page.experiment = await api(base);
      drawSummary(summary, page.experiment);
      await trials.draw();
      await curves.draw();
      // The heavier panels refresh every fourth tick.
      if (tick % 4 === 0) {
        page.parameters = await api(base + "/parameters");
        await loadSearchTrials(page);
        trials.render();
        importance.draw();
        search.draw();
        parcoords.draw();
        await Promise.all([compare.draw(), replicates.draw(), best.draw(), drawAlerts(alerts, id)]);
      }
      tick += 1;
    }, POLL_MS);
  };

  function drawSummary(summary, experiment) {
    const e = experiment;
    fill(summary, facts([
      ["name", e.name], ["team", e.team], ["state", e.state], ["trials", num(e.trial_count)],
      ["metric", (e.metric || "—") + " (" + e.mode + ")"],
      ["best", e.best ? num(value(e.best.value)) + " (" + XP.shortTrial(e.best.trial) + ")" : "—"],
      ["GPU-hours", num(e.gpu_hours, 2)], ["cost", num(e.cost, 2)], ["age", XP.age(e.submitted_at_ms)],
    ]), el("p", { class: "muted" }, Object.entries(e.counts || {}).map(([s, n]) => n + " " + s).join(" · ")));
  }

  // The best 1,000 trials that reported the metric: the scatter's and the
  // parallel coordinates' points.
  async function loadSearchTrials(page) {
    const metric = page.experiment.metric;
    if (!metric) { page.searchTrials = []; return; }
    const sort = page.experiment.mode === "max" ? "-metric" : "metric";
    const answer = await api(page.base + "/trials?limit=1000&sort=" + sort + "&state=succeeded,stopped,running");
    page.searchTrials = answer.items.filter((t) => t.config && typeof t.config === "object" && t.metrics && typeof t.metrics[metric] === "number");
  }

  // The trials table: a box to choose each for the side-by-side view, one
  // column per parameter. The Trial and metric columns sort the whole
  // experiment on the head (and page through it); the others sort the page.
  function trialsPanel(page, panel) {
    const state = { sort: "id", states: "", cursor: null, next: null };
    const view = { sort: 1, desc: false };
    const stateSelect = el("select", { id: "trial-state" }, ["", "queued", "running", "succeeded", "failed", "stopped", "cancelled"].map((s) => el("option", { value: s }, s || "any state")));
    const sortSelect = el("select", { id: "trial-sort" }, [["id", "id ↑"], ["-id", "id ↓"], ["metric", "metric ↑"], ["-metric", "metric ↓"]].map(([v, t]) => el("option", { value: v }, t)));
    const pageInfo = el("span", { class: "muted" });
    const next = el("button", {}, "next page");
    const first = el("button", {}, "first page");
    const chosen = el("span", { class: "muted", id: "chosen" });
    const holder = el("div", { id: "trials" });
    fill(panel, el("div", { class: "controls" }, stateSelect, sortSelect, first, next, pageInfo, chosen), holder);
    const panelApi = { onSelect: () => {} };
    let columns = [];
    const serverColumn = (name) => columns.findIndex((c) => c.server === name);
    stateSelect.addEventListener("change", () => { state.states = stateSelect.value; state.cursor = null; panelApi.draw(); });
    sortSelect.addEventListener("change", () => {
      state.sort = sortSelect.value;
      Object.assign(view, { sort: serverColumn(state.sort.endsWith("metric") ? "metric" : "id"), desc: state.sort.startsWith("-") });
      state.cursor = null;
      panelApi.draw();
    });
    next.addEventListener("click", () => { if (state.next) { state.cursor = state.next; panelApi.draw(); } });
    first.addEventListener("click", () => { state.cursor = null; panelApi.draw(); });

    const toggle = (trial, box) => {
      const at = page.selected.indexOf(trial);
      if (at >= 0) page.selected.splice(at, 1);
      else if (page.selected.length < MAX_COMPARE) page.selected.push(trial);
      else box.checked = false;
      panelApi.render();
      panelApi.onSelect();
    };
    const pick = (t) => {
      const box = el("input", { type: "checkbox", class: "pick", "data-trial": t.id, checked: page.selected.includes(t.id), title: "compare side by side" });
      box.addEventListener("change", () => toggle(t.id, box));
      return box;
    };

    panelApi.render = () => {
      const metric = page.experiment && page.experiment.metric;
      const metricOf = (t) => (metric && t.metrics ? t.metrics[metric] : null);
      const space = (page.parameters && page.parameters.parameters) || [];
      const numeric = (name) => page.trials.every((t) => !t.config || !(name in t.config) || typeof t.config[name] === "number");
      const paramColumns = parameterNames(space, page.trials).map((name) => ({
        title: name, key: (t) => (t.config ? t.config[name] : null), num: numeric(name), class: "param",
        cell: (t) => (t.config && name in t.config ? XP.value(t.config[name]) : "—"),
      }));
      columns = [
        { title: "", cell: pick, class: "pick" },
        { title: "Trial", server: "id", key: (t) => t.id, cell: (t) => trialLink(t.id), class: "mono" },
        { title: "State", key: (t) => t.state, cell: (t) => [XP.state(t.state), t.waiting ? el("div", { class: "muted" }, t.waiting) : null] },
        ...paramColumns,
        { title: metric || "metric", server: "metric", key: (t) => sortable(metricOf(t)), num: true, cell: (t) => num(value(metricOf(t))) },
        { title: "Step", key: (t) => t.last_step, num: true, cell: (t) => num(t.last_step) },
        { title: "Attempts", key: (t) => t.attempts.length, num: true, cell: (t) => num(t.attempts.length) },
        { title: "GPU-hours", key: (t) => t.gpu_hours, num: true, cell: (t) => num(t.gpu_hours, 3) },
        { title: "Reason", cell: (t) => t.reason || "", class: "reason" },
      ];
      fill(chosen, page.selected.length ? page.selected.length + " chosen to compare" : "tick 2 to 4 trials to compare them");
      fill(holder, table(columns, page.trials, view, () => {
        const server = columns[view.sort] && columns[view.sort].server;
        if (server) {
          state.sort = (view.desc ? "-" : "") + server;
          sortSelect.value = state.sort;
          state.cursor = null;
          panelApi.draw();
        } else {
          panelApi.render();
        }
      }));
    };
    panelApi.draw = async () => {
      let query = "?limit=100&sort=" + encodeURIComponent(state.sort);
      if (state.states) query += "&state=" + encodeURIComponent(state.states);
      if (state.cursor) query += "&cursor=" + encodeURIComponent(state.cursor);
      const answer = await api(page.base + "/trials" + query);
      state.next = answer.next_cursor;
      next.disabled = !state.next;
      fill(pageInfo, answer.items.length + " of " + answer.total + " trials");
      page.trials = answer.items;
      panelApi.render();
    };
    return panelApi;
  }

  // The chosen trials side by side: their outcomes and configurations (a
  // row per parameter, rows that differ marked) and their learning curves.
  function comparePanel(page, panel) {
    const note = el("p", { class: "muted", id: "compare-note" });
    const holder = el("div", { id: "compare" });
    const curves = el("div", { class: "chart", id: "compare-curves" });
    const clear = el("button", { id: "compare-clear" }, "clear the choice");
    clear.addEventListener("click", () => { page.selected = []; draw(); document.querySelectorAll("input.pick").forEach((box) => { box.checked = false; }); });
    fill(panel, el("div", { class: "controls" }, note, clear), holder, curves);
    let shown = "";
    async function draw() {
      const ids = page.selected.slice();
      const query = new URLSearchParams(window.location.search);
      if (ids.length) query.set("compare", ids.join(",")); else query.delete("compare");
      const search = query.toString();
      window.history.replaceState(null, "", window.location.pathname + (search ? "?" + search : ""));
      clear.disabled = !ids.length;
      if (ids.length < 2) {
        fill(note, "Tick 2 to " + MAX_COMPARE + " trials in the table above to see their configurations, outcomes and learning curves side by side" +
          (ids.length ? " (" + XP.shortTrial(ids[0]) + " chosen so far)." : "."));
        fill(holder);
        if (shown) Plotly.purge(curves);
        shown = "";
        curves.hidden = true;
        return;
      }
      fill(note, ids.length + " trials side by side; values that differ are marked.");
      curves.hidden = false;
      const details = await Promise.all(ids.map((trial) => api("/api/trials/" + encodeURIComponent(trial))));
      const metric = page.experiment && page.experiment.metric;
      fill(holder, compareTable(details, metric));
      if (!metric) return;
      const answer = await api(page.base + "/curves?trials=" + ids.map(encodeURIComponent).join(",") + "&metric=" + encodeURIComponent(metric));
      const traces = answer.series.map((s) => ({ type: "scatter", mode: "lines", name: XP.configLabel(s.trial, s.config), x: s.steps, y: s.values }));
      const name = XP.plotText(metric);
      await chart(curves, traces, { title: { text: name + " of the chosen trials" }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: name } } });
      shown = ids.join();
    }
    return { draw };
  }

  function compareTable(details, metric) {
    const lastAttempt = (t) => (t.attempts && t.attempts.length ? t.attempts[t.attempts.length - 1] : null);
    const outcome = (t) => {
      const attempt = lastAttempt(t);
      return (attempt && attempt.outcome) || t.reason || t.waiting || "—";
    };
    const rows = [
      ["state", (t) => XP.state(t.state)],
      ["outcome", (t) => el("span", { class: "outcome" }, outcome(t))],
      [metric || "metric", (t) => num(value(metric && t.metrics ? t.metrics[metric] : null))],
      ["step", (t) => num(t.last_step)],
      ["attempts", (t) => num((t.attempts || []).length)],
      ["GPU-hours", (t) => num(t.gpu_hours !== undefined ? t.gpu_hours : t.allocated_gpu_hours, 3)],
    ].map(([name, cell]) => ({ name, cells: details.map(cell), differs: false }));
    const names = parameterNames([], details);
    for (const name of names) {
      const values = details.map((t) => (t.config && name in t.config ? XP.value(t.config[name]) : "—"));
      rows.push({ name, cells: values, differs: new Set(values).size > 1, param: true });
    }
    const head = el("tr", {}, el("th", {}, ""), details.map((t) => el("th", {}, trialLink(t.id))));
    const body = rows.map((row) => el("tr", { class: [row.param ? "param" : "", row.differs ? "differs" : ""].join(" ").trim() || null },
      el("th", {}, row.name), row.cells.map((cell) => el("td", {}, cell))));
    return el("table", { id: "compare-table" }, el("thead", {}, head), el("tbody", {}, body));
  }

  function curvesPanel(page, panel) {
    const state = { metric: null, smoothing: 0.6, series: 10, metrics: new Set() };
    const metricSelect = el("select", { id: "curve-metric" });
    const smoothing = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: state.smoothing, id: "smoothing" });
    const smoothingText = el("span", {}, String(state.smoothing));
    const seriesSelect = el("select", { id: "curve-series" }, [5, 10, 20, 50].map((n) => el("option", { value: n, selected: n === state.series }, n + " best trials")));
    const curves = el("div", { class: "chart tall", id: "curves" });
    fill(panel, el("div", { class: "controls" }, el("label", {}, "metric ", metricSelect), el("label", {}, "EMA smoothing ", smoothing, " ", smoothingText), seriesSelect), curves);
    metricSelect.addEventListener("change", () => { state.metric = metricSelect.value; draw(); });
    smoothing.addEventListener("input", () => { state.smoothing = Number(smoothing.value); fill(smoothingText, smoothing.value); });
    smoothing.addEventListener("change", () => draw());
    seriesSelect.addEventListener("change", () => { state.series = Number(seriesSelect.value); draw(); });
    async function draw() {
      const experimentMetric = page.experiment && page.experiment.metric;
      if (!state.metric && experimentMetric) state.metric = experimentMetric;
      for (const trial of page.trials) Object.keys(trial.metrics || {}).forEach((m) => state.metrics.add(m));
      const names = [...new Set([experimentMetric, ...state.metrics].filter(Boolean))];
      if (names.join() !== [...metricSelect.options].map((o) => o.value).join()) {
        fill(metricSelect, names.map((n) => el("option", { value: n, selected: n === state.metric }, n)));
      }
      const metric = state.metric;
      if (!metric) { fill(curves, el("p", { class: "muted" }, "This experiment names no metric, and its trials have reported none yet.")); return; }
      const answer = await api(page.base + "/curves?metric=" + encodeURIComponent(metric) + "&series=" + state.series + "&smoothing=" + state.smoothing);
      if (!answer.series.some((s) => s.steps.length)) {
        fill(curves, el("p", { class: "muted" }, "No trial has reported " + metric + " yet; curves appear as trials report it (XP_METRIC lines or xp.report)."));
        return;
      }
      if (curves.firstChild && curves.firstChild.tagName === "P") fill(curves);
      const traces = answer.series.map((s) => ({
        type: "scatter", mode: "lines", name: XP.configLabel(s.trial, s.config), x: s.steps,
        y: s.smoothed || s.values, customdata: s.values,
        hovertemplate: "%{fullData.name}<br>step %{x}<br>" + "smoothed %{y:.4g} (raw %{customdata:.4g})<extra></extra>",
      }));
      const name = XP.plotText(metric);
      await chart(curves, traces, { title: { text: name }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: name } } });
    }
    return { draw };
  }

  // The parameter's description from the search space, if it has one.
  const spaceOf = (page, name) => ((page.parameters && page.parameters.parameters) || []).find((p) => p.name === name);

  // A parameter against the metric, one point per trial (SVG, so it draws
  // without WebGL): a log axis for a log-distributed parameter, categories
  // for a choice; it starts on the most important parameter.
  function searchPanel(page, grid) {
    const paramSelect = el("select", { id: "search-param" });
    const search = el("div", { class: "chart", id: "search" });
    grid.append(el("div", {}, el("h2", {}, "A parameter against the metric"), el("div", { class: "panel" },
      el("div", { class: "controls" }, el("label", {}, "parameter ", paramSelect)), search)));
    paramSelect.addEventListener("change", () => { page.userParam = paramSelect.value; plot(); });
    function plot() {
      const metric = page.experiment.metric;
      const name = paramSelect.value;
      const trials = page.searchTrials.filter((t) => name in t.config);
      const param = spaceOf(page, name);
      const categorical = (param && param.scale === "categorical") || trials.some((t) => typeof t.config[name] !== "number");
      const axis = { title: { text: XP.plotText(name) + (param && param.scale === "log" ? " (log scale)" : "") } };
      if (param && param.scale === "log") axis.type = "log";
      else if (categorical) axis.type = "category";
      chart(search, [{
        type: "scatter", mode: "markers", name: XP.plotText(metric),
        x: trials.map((t) => (categorical ? XP.plotText(XP.value(t.config[name])) : t.config[name])),
        y: trials.map((t) => t.metrics[metric]),
        text: trials.map((t) => XP.plotText(XP.shortTrial(t.id) + " " + XP.configText(t.config))),
        hovertemplate: "%{text}<br>" + "%{y:.4g}<extra></extra>",
        marker: { size: 7, opacity: 0.7 },
      }], { xaxis: axis, yaxis: { title: { text: XP.plotText(metric) } }, showlegend: false });
    }
    function draw() {
      const metric = page.experiment.metric;
      if (!metric) { fill(search, el("p", { class: "muted" }, "This experiment names no metric to plot parameters against.")); return; }
      const names = [...new Set(page.searchTrials.flatMap((t) => Object.keys(t.config)))].filter((n) => n !== "seed");
      if (!names.length) { fill(search, el("p", { class: "muted" }, "No trial has reported " + metric + " yet; each trial appears here once it does.")); return; }
      const importance = page.parameters && page.parameters.importance;
      const ranked = importance && importance.status === "rated" ? importance.values.map((v) => v.name).filter((n) => names.includes(n)) : [];
      const numeric = names.find((n) => page.searchTrials.every((t) => !(n in t.config) || typeof t.config[n] === "number"));
      const chosen = names.includes(page.userParam) ? page.userParam : ranked[0] || numeric || names[0];
      if (names.join() !== [...paramSelect.options].map((o) => o.value).join()) {
        fill(paramSelect, names.map((n) => el("option", { value: n }, n)));
      }
      paramSelect.value = chosen;
      if (search.firstChild && search.firstChild.tagName === "P") fill(search);
      plot();
    }
    return { draw };
  }

  // Parameter importance by PED-ANOVA, computed by the head, its method named.
  function importancePanel(page, grid) {
    const holder = el("div", { id: "importance" });
    grid.append(el("div", {}, el("h2", {}, "Parameter importance"), el("div", { class: "panel" }, holder)));
    function draw() {
      const answer = page.parameters;
      const rating = answer && answer.importance;
      if (!rating) return;
      const method = el("p", { class: "method" }, "Method: ", el("b", {}, rating.method), " (" + rating.reference + "): how differently each parameter is distributed among the best " +
        num(100 * rating.gamma) + "% of finished trials than among all of them. Importances add up to 1.");
      const unrated = rating.unrated.length ? el("p", { class: "muted" }, "Not rated: " + rating.unrated.map((u) => u.name + " (" + u.why + ")").join(", ") + ".") : null;
      if (rating.status !== "rated") {
        const what = {
          not_enough_trials: "Not enough trials yet: " + rating.trials + " finished with a value of " + answer.metric + ", " + rating.needed + " needed. The ranking appears once " + rating.needed + " trials have finished.",
          no_metric: "This experiment names no metric, so no parameter can be rated against it.",
          no_parameters: "This experiment's search space has no parameter every trial takes, so there is nothing to rate.",
        }[rating.status] || rating.message;
        fill(holder, method, el("p", { class: "empty" }, what), unrated);
        return;
      }
      const rows = rating.values.map((v) => el("tr", {},
        el("td", { class: "param-name" }, v.name),
        el("td", { class: "bar-cell" }, el("div", { class: "bar", style: "width: " + (100 * v.importance).toFixed(1) + "%" })),
        el("td", { class: "num" }, num(100 * v.importance, 1) + "%")));
      fill(holder, method,
        el("p", { class: "muted" }, "From " + num(rating.trials) + " finished trials, the best " + num(rating.top_trials) + " of them by " + answer.metric + " (" + answer.mode + ")."),
        el("table", { class: "importance" }, el("thead", {}, el("tr", {}, el("th", {}, "Parameter"), el("th", {}, ""), el("th", {}, "Importance"))), el("tbody", {}, rows)),
        unrated);
    }
    return { draw };
  }

  // One axis of the parallel coordinates: numbers as they are, a log
  // parameter as its base-10 logarithm labelled with the values, a choice as
  // the index of its value labelled with the value.
  function dimension(param, name, trials) {
    const raw = trials.map((t) => t.config[name]);
    const label = XP.plotText(name);
    if ((param && param.scale === "categorical") || raw.some((v) => typeof v !== "number")) {
      const labels = param && param.choices ? param.choices.map(XP.value) : [...new Set(raw.map(XP.value))];
      return {
        label, values: raw.map((v) => labels.indexOf(XP.value(v))), range: [0, Math.max(1, labels.length - 1)],
        // Tick labels are drawn as text (not plotly's HTML subset): unescaped.
        tickvals: labels.map((_, index) => index), ticktext: labels,
      };
    }
    if (param && param.scale === "log" && param.low > 0) {
      const low = Math.log10(param.low);
      const high = Math.log10(param.high);
      const ticks = [];
      for (let decade = Math.ceil(low); decade <= Math.floor(high); decade += 1) ticks.push(decade);
      if (ticks.length < 2) ticks.splice(0, ticks.length, low, high);
      return { label: label + " (log)", values: raw.map(Math.log10), range: [low, high], tickvals: ticks, ticktext: ticks.map((d) => XP.num(10 ** d)) };
    }
    const range = param && typeof param.low === "number" ? [param.low, param.high] : undefined;
    return { label, values: raw, range };
  }

  // Parallel coordinates over the parameters every plotted trial has and the
  // metric, coloured by the metric (best brightest). Dragging along an axis
  // keeps the trials in that range (plotly's constraint ranges); the panel
  // says which trials are kept and can compare them. The ranges survive a
  // redraw, which happens only when the trials change.
  function parcoordsPanel(page, panel) {
    const note = el("p", { class: "muted" }, "Drag along an axis to keep only the trials in that range; drag on another part of it to add a range, click a range to remove it.");
    const filter = el("div", { id: "parcoords-filter", class: "controls" });
    const plot = el("div", { class: "chart tall", id: "parcoords" });
    fill(panel, note, plot, filter);
    const result = { onChoose: () => {} };
    let drawn = "";
    let shown = [];
    function kept() {
      const dimensions = (plot.data && plot.data[0] && plot.data[0].dimensions) || [];
      const inside = (v, range) => {
        const ranges = Array.isArray(range[0]) ? range : [range];
        return ranges.some(([a, b]) => v >= Math.min(a, b) && v <= Math.max(a, b));
      };
      return shown.filter((_, index) => dimensions.every((d) => !d.constraintrange || inside(d.values[index], d.constraintrange)));
    }
    function describe() {
      const trials = kept();
      const filtered = trials.length !== shown.length;
      const compare = el("button", { id: "parcoords-compare", disabled: trials.length < 2 || trials.length > MAX_COMPARE }, "compare these");
      compare.addEventListener("click", () => result.onChoose(trials.map((t) => t.id)));
      fill(filter, el("span", { id: "parcoords-count" }, (filtered ? trials.length + " of " + shown.length + " trials in the chosen ranges" : shown.length + " trials") + (trials.length ? ": " : ""),
        trials.slice(0, 12).map((t, index) => [index ? ", " : "", trialLink(t.id)]), trials.length > 12 ? " …" : ""), compare);
    }
    result.draw = () => {
      const metric = page.experiment.metric;
      if (!metric) { fill(plot, el("p", { class: "muted" }, "This experiment names no metric.")); return; }
      if (!XP.webgl()) { fill(plot, el("p", { class: "muted" }, "Parallel coordinates need WebGL, which this browser does not offer.")); return; }
      const trials = page.searchTrials;
      const names = parameterNames((page.parameters && page.parameters.parameters) || [], trials).filter((n) => n !== "seed" && trials.every((t) => n in t.config));
      if (trials.length < 2 || !names.length) {
        fill(plot, el("p", { class: "muted" }, "Parallel coordinates appear once two trials have reported " + metric + "."));
        fill(filter);
        drawn = "";
        return;
      }
      const signature = JSON.stringify([names, trials.map((t) => [t.id, t.metrics[metric]])]);
      if (signature === drawn) return;
      const previous = new Map(((plot.data && plot.data[0] && plot.data[0].dimensions) || []).map((d) => [d.label, d.constraintrange]));
      if (plot.firstChild && plot.firstChild.tagName === "P") fill(plot);
      shown = trials;
      const dimensions = names.map((name) => dimension(spaceOf(page, name), name, trials));
      dimensions.push({ label: XP.plotText(metric), values: trials.map((t) => t.metrics[metric]) });
      for (const d of dimensions) if (previous.get(d.label)) d.constraintrange = previous.get(d.label);
      const colors = trials.map((t) => t.metrics[metric]);
      chart(plot, [{
        type: "parcoords", dimensions,
        line: { color: colors, colorscale: "Viridis", reversescale: page.experiment.mode !== "max", showscale: true, colorbar: { title: { text: XP.plotText(metric) }, thickness: 12 } },
        labelangle: 0, labelside: "top",
      }], { margin: { l: 60, r: 80, t: 50, b: 30 }, showlegend: false }).then(() => {
        if (!plot.__xpListening) {
          plot.on("plotly_restyle", describe);
          plot.__xpListening = true;
        }
        describe();
      });
      drawn = signature;
    };
    return result;
  }

  function replicatesPanel(page, grid) {
    const holder = el("div", { id: "replicates" }, "…");
    section(grid, "Replicates per configuration", holder);
    async function draw() {
      if (!page.experiment.metric) { fill(holder, el("p", { class: "muted" }, "This experiment names no metric.")); return; }
      const answer = await api(page.base + "/replicates");
      fill(holder, el("p", { class: "muted" }, answer.total_groups + " configurations; mean and Student-t 95% interval of each one's finished replicates, best first"),
        table([
          { title: "Config", cell: (g) => XP.configText(g.config), class: "config" },
          { title: "Trials", num: true, cell: (g) => num(g.trials) },
          { title: "Finished", num: true, cell: (g) => num(g.n) },
          { title: "Mean " + answer.metric, num: true, cell: (g) => num(g.mean) },
          { title: "Std dev", num: true, cell: (g) => num(g.std_dev) },
          { title: "95% CI", num: true, cell: (g) => (g.ci95_low === null ? "—" : "[" + num(g.ci95_low) + ", " + num(g.ci95_high) + "]") },
          { title: "First trial", cell: (g) => (g.first_trial ? trialLink(g.first_trial) : "—") },
        ], answer.groups.slice(0, 50)));
    }
    return { draw };
  }

  function bestPanel(page, grid) {
    const best = el("div", { class: "chart small", id: "best-vs-gpu-hours" });
    const note = el("p", { class: "muted" });
    grid.append(el("div", {}, el("h2", {}, "Best so far against GPU-hours"), el("div", { class: "panel" }, note, best)));
    async function draw() {
      const report = await api("/api/report?experiment=" + encodeURIComponent(page.id), true);
      const returns = report && (report.returns || []).find((r) => r.experiment === page.id);
      const points = (report && report.best_vs_gpu_hours) || (returns && returns.best_vs_gpu_hours);
      if (!points) { fill(note, "The cost report is not available on this head."); return; }
      fill(note, facts([
        ["GPU-hours", num(report.gpu_hours, 3)], ["lost", num(report.gpu_hours_lost, 3)], ["cost", num(report.cost, 2)],
        ["last quarter's gain", num(report.last_quarter_gain !== undefined ? report.last_quarter_gain : returns && returns.last_quarter_gain)],
        ["ROI", report.roi_percent === null || report.roi_percent === undefined ? "—" : num(report.roi_percent, 1) + "%"],
      ]));
      await chart(best, [{ type: "scatter", mode: "lines+markers", line: { shape: "hv" }, x: points.map((p) => p.gpu_hours), y: points.map((p) => p.best), name: "best so far" }],
        { xaxis: { title: { text: "cumulative GPU-hours" }, rangemode: "tozero" }, yaxis: { title: { text: XP.plotText(page.experiment.metric || "best") } }, showlegend: false });
    }
    return { draw };
  }

  async function drawAlerts(alerts, id) {
    const answer = await api("/api/alerts?experiment=" + encodeURIComponent(id), true);
    if (!answer) { fill(alerts, el("span", { class: "muted" }, "Alerts are not available on this head.")); return; }
    const items = answer.items || answer.alerts || (Array.isArray(answer) ? answer : []);
    if (!items.length) { fill(alerts, el("span", { class: "muted" }, "none")); return; }
    fill(alerts, table([
      { title: "When", cell: (a) => XP.time(a.at_ms) },
      { title: "Trial", cell: (a) => trialLink(a.trial) },
      { title: "Rule", cell: (a) => a.rule + " (" + a.kind + ")" },
      { title: "Message", cell: (a) => a.message },
      { title: "Delivery", cell: (a) => a.delivery },
    ], items.slice(0, 50)));
  }
})();
