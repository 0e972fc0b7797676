// The dashboard's shared helpers: building elements (every value from the API
// goes in as text, never as HTML: configurations and metric names are users'
// text), calling the API, polling, sortable tables and plotly charts. The
// pages themselves are in pages.js.
"use strict";

// Errors the page met, for the browser test and for a person looking at the
// console: uncaught errors and rejected promises are both recorded.
window.__xpErrors = [];
window.addEventListener("error", (event) => {
  window.__xpErrors.push(String(event.message || event.error));
});
window.addEventListener("unhandledrejection", (event) => {
  window.__xpErrors.push("unhandled rejection: " + String(event.reason));
});
// A script, style or connection the Content-Security-Policy refused.
document.addEventListener("securitypolicyviolation", (event) => {
  window.__xpErrors.push("CSP refused " + event.blockedURI + " (" + event.violatedDirective + ")");
});

const XP = {};

// An element with attributes and children; strings become text nodes.
XP.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "onclick" || name === "onchange" || name === "oninput") {
      node.addEventListener(name.slice(2), value);
    } else {
      node.setAttribute(name, String(value));
    }
  }
  XP.append(node, children);
  return node;
};

// Children may nest in arrays to any depth; every level is flattened (an
// element left inside an array would show as its text form: a link as its
// whole URL).
XP.append = function (node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
};

// Replaces a node's children.
XP.fill = function (node, ...children) {
  node.replaceChildren();
  return XP.append(node, children);
};

XP.link = (href, text) => XP.el("a", { href }, text);

// A JSON API call. A 404 answers null when `optional` (an endpoint this head
// does not serve yet); any other failure throws with the API's message.
XP.api = async function (path, optional) {
  const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) {
    window.location.assign("/login");
    throw new Error("not logged in");
  }
  if (response.status === 404 && optional) return null;
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    if (optional) return null;
    throw new Error(path + ": " + response.status + " (not JSON)");
  }
  if (!response.ok) {
    if (optional && response.status === 400) return null;
    throw new Error((body && body.error) || path + ": " + response.status);
  }
  return body;
};

// Calls `refresh` now and every `ms` milliseconds; the footer says when the
// page was last brought up to date, or what went wrong.
XP.poll = function (refresh, ms) {
  const status = document.getElementById("status");
  const run = async () => {
    try {
      await refresh();
      status.className = "";
      XP.fill(status, "updated " + new Date().toLocaleTimeString());
    } catch (error) {
      status.className = "error";
      XP.fill(status, "update failed: " + error.message);
    }
    window.setTimeout(run, ms);
  };
  run();
};

// A number for people: with `digits`, that many decimals (GPU-hours, costs);
// without, integers as integers and other numbers to 4 significant digits
// (1.235e-4, 0.01235, 123.5), never the 17 digits of a float's full text.
// -0 shows as 0.
XP.num = function (value, digits) {
  if (value === undefined || value === null || Number.isNaN(value)) return "—";
  if (typeof value !== "number") return String(value);
  if (value === 0) return "0";
  if (!Number.isFinite(value)) return value > 0 ? "∞" : "−∞";
  const magnitude = Math.abs(value);
  if (digits !== undefined) {
    if (magnitude < 1e-3 || magnitude >= 1e6) return XP.sig(value, 4);
    return value.toFixed(digits).replace(/\.?0+$/, "") || "0";
  }
  if (Number.isInteger(value) && magnitude < 1e15) return value.toLocaleString("en-US");
  return XP.sig(value, 4);
};

// `value` to `places` significant digits: plain between 0.001 and a million,
// else in exponent form without trailing zeros (1e-5, 2.5e+7).
XP.sig = function (value, places) {
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e6)) {
    const [mantissa, exponent] = value.toExponential(places - 1).split("e");
    return mantissa.replace(/\.?0+$/, "") + "e" + exponent;
  }
  const text = Number(value.toPrecision(places)).toString();
  return text === "-0" ? "0" : text;
};

// A parameter's value as a cell: numbers formatted, text as text, anything
// else (a list, a map) as JSON.
XP.value = function (value) {
  if (typeof value === "number") return XP.num(value);
  if (typeof value === "string") return value;
  if (typeof value === "boolean") return String(value);
  return XP.json(value);
};

// Whether this browser can draw WebGL (parallel coordinates need it).
XP.webgl = function () {
  try {
    const canvas = document.createElement("canvas");
    return Boolean(canvas.getContext("webgl") || canvas.getContext("experimental-webgl"));
  } catch (error) {
    return false;
  }
};

XP.bytes = function (value) {
  if (value === undefined || value === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return value.toFixed(unit === 0 ? 0 : 1) + " " + units[unit];
};

XP.duration = function (ms) {
  if (ms === undefined || ms === null) return "—";
  if (ms < 1000) return Math.max(0, Math.round(ms)) + "ms";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
};

XP.age = (ms) => (ms ? XP.duration(Date.now() - ms) : "—");
XP.time = (ms) => (ms ? new Date(ms).toLocaleString() : "—");
XP.state = (state) => XP.el("span", { class: "state " + state }, state);
XP.json = (value) => (value === undefined || value === null ? "—" : JSON.stringify(value));

// A sortable table: `columns` are {title, key (a function of the row giving
// the value to sort by), cell (a function giving the cell's content), num,
// server (the rows come sorted by this column already)};
// `view.sort` and `view.desc` keep the order across redraws.
XP.table = function (columns, rows, view, onSort) {
  const head = XP.el("tr", {}, columns.map((column, index) => {
    const sorted = view && view.sort === index;
    const th = XP.el("th", {
      class: [column.key ? "sortable" : "", sorted ? (view.desc ? "sorted-desc" : "sorted-asc") : ""].join(" ").trim() || null,
    }, column.title);
    if (column.key && view) {
      th.addEventListener("click", () => {
        view.desc = view.sort === index ? !view.desc : false;
        view.sort = index;
        onSort();
      });
    }
    return th;
  }));
  let ordered = rows;
  // A column marked `server` is in the order the head gave.
  const sortedBy = view && view.sort !== undefined ? columns[view.sort] : null;
  if (sortedBy && sortedBy.key && !sortedBy.server) {
    const key = columns[view.sort].key;
    ordered = rows.slice().sort((a, b) => XP.compare(key(a), key(b)) * (view.desc ? -1 : 1));
  }
  const body = ordered.map((row) => XP.el("tr", {}, columns.map((column) =>
    XP.el("td", { class: column.num ? "num" : column.class || null }, column.cell(row)))));
  return XP.el("table", {}, XP.el("thead", {}, head), XP.el("tbody", {}, body));
};

// Orders numbers numerically and everything else as text; missing values last.
XP.compare = function (a, b) {
  const missing = (value) => value === undefined || value === null || Number.isNaN(value);
  if (missing(a) || missing(b)) return missing(a) - missing(b);
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b));
};

// Draws or redraws a plotly chart in place (zoom survives a redraw).
XP.chart = function (node, traces, layout) {
  const base = {
    margin: { l: 55, r: 15, t: 36, b: 40 },
    hovermode: "closest",
    uirevision: "keep",
    // The legend goes under the whole figure (container coordinates), the
    // bottom margin grown to hold it, so it never covers the x axis title.
    legend: { orientation: "h", x: 0, xanchor: "left", y: 0, yref: "container", yanchor: "bottom" },
    font: { size: 11 },
  };
  // Titles on the left, clear of the mode bar on the right.
  if (layout && layout.title) layout.title = Object.assign({ x: 0.01, xanchor: "left" }, layout.title);
  const entries = traces.filter((trace) => trace.showlegend !== false).length;
  const legendShown = !(layout && layout.showlegend === false) && entries > 1;
  const merged = Object.assign(base, layout);
  merged.margin = Object.assign({ l: 55, r: 15, t: 36, b: 40 }, layout && layout.margin);
  if (legendShown) {
    // One row of legend per about three entries, each row about 18 px.
    const rows = Math.min(6, Math.ceil(entries / 3));
    merged.margin.b = Math.max(merged.margin.b, 62 + 18 * rows);
  }
  return Plotly.react(node, traces, merged, { responsive: true, displaylogo: false })
    .then(() => {
      // A chart first drawn while the page was still being laid out keeps the
      // width it had then; fit it to its box.
      if (node._fullLayout && Math.abs(node._fullLayout.width - node.clientWidth) > 2) {
        return Plotly.Plots.resize(node);
      }
      return null;
    });
};

// Users' text for a chart: plotly.js reads a few HTML tags (<b>, <a>, <br>)
// in names, labels and titles, so their markup is escaped to show as text.
XP.plotText = (text) => String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

// A configuration as one line of text: `lr=1.235e-4 layers=3 optimizer=adam`.
XP.configText = function (config) {
  if (!config || typeof config !== "object" || Array.isArray(config)) return XP.json(config);
  return Object.entries(config).map(([name, value]) => name + "=" + XP.value(value)).join(" ");
};

// A trial's short name within its experiment: `t12`.
XP.shortTrial = (trial) => String(trial).replace(/^.*-t/, "t");

// A short label for a trial's configuration, for legends (plotly text).
XP.configLabel = function (trial, config) {
  if (!config || typeof config !== "object") return trial;
  let text = Object.entries(config).map(([name, value]) => name + "=" + XP.value(value)).join(" ");
  if (text.length > 60) text = text.slice(0, 57) + "…";
  return XP.plotText(trial.replace(/^.*-t/, "t") + " " + text);
};

XP.params = () => new URLSearchParams(window.location.search);
XP.enc = encodeURIComponent;

// A section with a heading and a body node the page fills.
XP.section = function (parent, title, body) {
  parent.append(XP.el("h2", {}, title));
  const panel = XP.el("div", { class: "panel" }, body);
  parent.append(panel);
  return panel;
};

XP.facts = (pairs) => XP.el("div", { class: "facts" }, pairs.map(([name, value]) =>
  XP.el("span", {}, name + ": ", XP.el("b", {}, value))));

window.XP = XP;
