// The dashboard's pages, chosen by the address: experiments, one experiment
// (experiment.js), one trial, queues, nodes and the cluster. Each polls the JSON API and
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
      if (!items.length) {
        fill(holder, el("div", { class: "empty", id: "empty-experiments" },
          el("p", {}, el("b", {}, "No experiment yet.")),
          el("p", {}, "Describe a sweep in a YAML file and submit it: ", el("code", {}, "xp submit sweep.yaml"),
            " (or ", el("code", {}, "xp run sweep.yaml"), " to submit it and follow it to the end). It shows here as soon as the head accepts it."),
          el("p", { class: "muted" }, "The guide's first sweep (docs/guide/first-sweep.md) walks through one.")));
        return;
      }
      if (!rows.length) { fill(holder, el("p", { class: "empty" }, "No experiment matches \u201c" + filter.value.trim() + "\u201d.")); return; }
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
        ["state", trial.state], ["config", XP.configText(trial.config)], ["step", num(trial.last_step)],
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
      if (!items.length) {
        fill(holder, noNode());
        fill(slots, el("p", { class: "muted" }, "GPU slots appear here once a node has joined."));
        return;
      }
      draw();
      const telemetry = new Map(items.map((n) => [n.id, new Map((n.gpu_telemetry || []).map((g) => [g.index, g]))]));
      const gpus = await api("/api/gpus");
      const rows = gpus.nodes.filter((n) => n.gpus.length);
      // Each slot names the trial on it by its id (experiment-tN), linked to
      // the trial's page, and the rank.
      fill(slots, rows.length ? table([
        { title: "Node", cell: (n) => n.name },
        { title: "GPUs", cell: (n) => n.gpus.map((g) => {
          const sample = (telemetry.get(n.id) || new Map()).get(g.index);
          const holders = g.workers.map((w, index) => (w.trial
            ? [index ? ", " : "", link("/trials/" + encodeURIComponent(w.trial), w.trial), " rank " + w.rank]
            : [index ? ", " : "", "another team's trial"]));
          return el("span", { class: "slot" + (g.busy_milli ? " busy" : ""), title: g.model },
            el("b", {}, "GPU " + g.index), " ", holders.length ? holders : el("span", { class: "muted" }, "free"),
            sample ? el("div", { class: "muted" }, num(sample.util, 0) + "% · " + XP.bytes(sample.memory_used_bytes)) : null);
        }) },
      ], rows) : el("p", { class: "muted" }, "No node offers GPUs: nodes without GPUs run CPU-only trials."));
    }, POLL_MS);
  }

  // What a page says when no node has joined: how to join one.
  function noNode() {
    return el("div", { class: "empty", id: "empty-nodes" },
      el("p", {}, el("b", {}, "No node has joined this cluster yet."), " Trials wait until one does."),
      el("p", {}, "On each machine that should run trials, start a node with the join string the head printed at its first start: ",
        el("code", {}, "xp-node join --join-file ~/.xp-join --data-dir /var/lib/xp-node"),
        " (the file holds the join string, readable by its owner only). On the head machine, ",
        el("code", {}, "xp-head node-credential --data-dir DIR"), " prints the join string again."),
      el("p", { class: "muted" }, "A machine without GPUs can declare slots for testing: xp-node join --gpus 2. The guide to a cluster by hand (docs/guide/cluster-by-hand.md) has the details."));
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
    const empty = el("div", { id: "cluster-empty" });
    note.after(empty);
    // A y axis for quantities that cannot be negative: from zero, and 0 to 1
    // while there is nothing to show (plotly would centre an empty or flat
    // axis on zero, half of it negative).
    const countAxis = (...series) => {
      const values = series.flat().filter((v) => typeof v === "number" && Number.isFinite(v));
      return values.some((v) => v > 0) ? { rangemode: "tozero" } : { range: [0, 1] };
    };
    poll(async () => {
      const h = await api("/api/cluster?buckets=60");
      const x = h.buckets.map((b) => new Date(b.start_ms));
      const capacity = Math.max(0, h.capacity_gpus || 0);
      fill(note, "From " + XP.time(h.since_ms) + ", in buckets of " + XP.duration(h.bucket_ms) + "; " +
        (capacity ? num(capacity) + (capacity === 1 ? " GPU" : " GPUs") + " on ready nodes now." : "no node is ready now."));
      if (capacity) fill(empty);
      else fill(empty, (await api("/api/nodes?limit=1", true) || { items: [] }).items.length ? el("p", { class: "empty" }, "No node is ready: those that joined are draining or lost (see Nodes).") : noNode());
      const line = (name, ys) => ({ type: "scatter", mode: "lines", line: { shape: "hv" }, name, x, y: ys });
      // The time axis spans the window, a minute at least: a young cluster's
      // one bucket would otherwise be stretched over milliseconds.
      const xaxis = { type: "date", range: [new Date(h.since_ms), new Date(Math.max(h.until_ms, h.since_ms + 60000))] };
      const allocated = h.buckets.map((b) => b.allocated_gpus);
      chart(util, [line("allocated GPUs", allocated), Object.assign(line("utilisation", h.buckets.map((b) => b.utilization)), { yaxis: "y2" })],
        { title: { text: "GPUs allocated and utilisation" }, margin: { r: 55, t: 30 }, xaxis, yaxis: Object.assign({ title: { text: "GPUs" } }, countAxis(allocated, [capacity])),
          yaxis2: { overlaying: "y", side: "right", range: [0, 1], tickformat: ".0%" } });
      const rates = h.buckets.map((b) => b.throughput_per_hour);
      chart(throughput, [line("trials finished per hour", rates)], { title: { text: "Throughput (trials finished per hour)" }, xaxis, yaxis: countAxis(rates) });
      const times = h.buckets.map((b) => b.mean_time_in_system_s);
      chart(time, [Object.assign(line("mean time in system (s)", times), { mode: "lines+markers", connectgaps: true })], { title: { text: "Time in system (s)" }, xaxis, yaxis: countAxis(times) });
      const counts = h.buckets.map((b) => b.in_system);
      chart(count, [line("trials in system", counts)], { title: { text: "Number in system" }, xaxis, yaxis: countAxis(counts) });
      const byTeam = Object.entries(h.gpu_hours_by_team || {});
      chart(teams, [{ type: "bar", x: byTeam.map(([t]) => XP.plotText(t)), y: byTeam.map(([, v]) => v), name: "GPU-hours" }],
        { title: { text: "GPU-hours by team" }, showlegend: false, yaxis: countAxis(byTeam.map(([, v]) => v)),
          xaxis: byTeam.length ? {} : { visible: false },
          annotations: byTeam.length ? [] : [{ text: "no GPU-hours yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] });
      // The cost report of the last week, where this head serves one.
      const r = await api("/api/report?since=7d", true);
      fill(report, r ? [el("h2", {}, "Last 7 days (cost report)"), facts([
        ["GPU-hours", num(r.gpu_hours, 2)], ["lost", num(r.gpu_hours_lost, 2)], ["cost", num(r.cost, 2)],
        ["utilisation", r.utilization === null || r.utilization === undefined ? "—" : num(100 * r.utilization, 1) + "%"],
        ["throughput", num(r.throughput_per_hour, 2) + " trials/h"], ["W", r.mean_time_in_system_s === null || r.mean_time_in_system_s === undefined ? "—" : num(r.mean_time_in_system_s, 1) + " s"],
        ["L", num(r.mean_in_system, 2)], ["L / λW", num(r.littles_law_ratio, 3)],
      ])] : el("p", { class: "muted" }, "The cost report is not available on this head."));
    }, 5000);
  }

  async function route() {
    const path = window.location.pathname;
    api("/api/whoami", true).then((me) => { if (me) fill(document.getElementById("user"), me.user); }).catch(() => {});
    let match;
    if (path === "/") return experimentsPage();
    if ((match = path.match(/^\/experiments\/([^/]+)$/))) return XP.experimentPage(main, decodeURIComponent(match[1]));
    if ((match = path.match(/^\/trials\/([^/]+)$/))) return trialPage(decodeURIComponent(match[1]));
    if (path === "/queues") return queuesPage();
    if (path === "/nodes") return nodesPage();
    if (path === "/cluster") return clusterPage();
    fill(main, el("p", {}, "No such page."));
  }

  route();
})();
