//! The dashboard test's page checks: what each page must show, read from the
//! page's elements and from Plotly's own state (`gd.data`, `gd._fullLayout`).

use serde_json::{Value, json};

use super::browser::Page;
use super::{HOSTILE, TRIALS};

/// A script answering, for each chart named, the lower end of its y axis.
const Y_AXIS_LOWS: &str = "return arguments[0].map((id) => { const gd = document.getElementById(id); \
     return gd && gd._fullLayout && gd._fullLayout.yaxis ? gd._fullLayout.yaxis.range[0] : null; })";

/// The charts of the cluster page.
const CLUSTER_CHARTS: [&str; 5] = [
    "utilization",
    "throughput",
    "time-in-system",
    "in-system",
    "gpu-hours-by-team",
];

impl Page<'_> {
    /// The login page wears the dashboard's stylesheet (its background, its
    /// header) and runs no script.
    pub(crate) async fn check_login_page(&self) {
        self.open("/login").await;
        self.wait_for(
            "the login page in the dashboard's style",
            "const style = getComputedStyle(document.body); \
             return [style.backgroundColor, !!document.querySelector('header .brand'), !!document.querySelector('form input[type=password]')]",
            |found| *found == json!(["rgb(246, 247, 249)", true, true]),
        )
        .await;
        self.done_with("login", false).await;
    }

    /// Logs in by `/login?token=`, which lands on the experiments page.
    pub(crate) async fn log_in(&self, secret: &str) {
        self.open(&format!("/login?token={secret}")).await;
        self.wait_for(
            "the experiments page after the login",
            "return !!document.getElementById('filter')",
            |found| *found == json!(true),
        )
        .await;
    }

    /// With no node and no experiment: the experiments page says how to
    /// submit, the nodes page how to join a node, and the cluster page says
    /// so too, without "-0 GPUs" and without a negative axis.
    pub(crate) async fn check_empty_cluster(&self) {
        self.open("/").await;
        self.wait_text("#empty-experiments", "xp submit sweep.yaml")
            .await;
        self.done("empty-experiments").await;

        self.open("/nodes").await;
        self.wait_text("#empty-nodes", "xp-node join").await;
        self.done("empty-nodes").await;

        self.open("/cluster").await;
        self.wait_text("#cluster-empty", "xp-node join").await;
        let note = self
            .value("return document.querySelector('main p.muted').textContent")
            .await;
        let note = note.as_str().unwrap_or_default();
        assert!(
            note.contains("no node is ready now") && !note.contains("-0"),
            "{note}"
        );
        self.check_y_axes_from_zero(&CLUSTER_CHARTS).await;
        self.done("empty-cluster").await;
    }

    /// Waits until the text of `selector` holds `text`.
    async fn wait_text(&self, selector: &str, text: &str) {
        self.wait_for(
            &format!("{text:?} in {selector}"),
            &format!("const node = document.querySelector({selector:?}); return node ? node.textContent : ''"),
            |found| found.as_str().is_some_and(|found| found.contains(text)),
        )
        .await;
    }

    /// Every chart named is drawn and its y axis starts at zero or above.
    async fn check_y_axes_from_zero(&self, charts: &[&str]) {
        let script = Y_AXIS_LOWS.replace("arguments[0]", &json!(charts).to_string());
        let lows = self
            .wait_for("the charts drawn", &script, |lows| {
                lows.as_array()
                    .is_some_and(|lows| lows.iter().all(Value::is_number))
            })
            .await;
        for (chart, low) in charts.iter().zip(lows.as_array().expect("lows")) {
            assert!(
                low.as_f64().unwrap() >= 0.0,
                "{chart}'s y axis starts at {low}"
            );
        }
    }

    /// The experiments page lists the experiment.
    pub(crate) async fn check_experiments(&self, experiment: &str) {
        self.open("/").await;
        self.wait_text("#experiments", experiment).await;
        self.done("experiments").await;
    }

    /// The experiment's page, each of its views in turn.
    pub(crate) async fn check_experiment(&self, experiment: &str) {
        self.open(&format!("/experiments/{experiment}")).await;
        self.wait_for(
            "the experiment's id",
            "return document.getElementById('experiment-id').textContent",
            |text| text.as_str() == Some(experiment),
        )
        .await;
        self.wait_for(
            "its trials in the table",
            "return document.querySelectorAll('#trials tbody tr').length",
            |rows| rows.as_u64() == Some(TRIALS as u64),
        )
        .await;
        self.check_parameter_columns().await;
        self.check_curves_and_hostile_text().await;
        self.check_importance_and_scatter().await;
        self.check_parallel_coordinates().await;
        self.check_side_by_side().await;
        self.value("window.scrollTo(0, 0); return true").await;
        self.done("experiment").await;
    }

    /// One column per parameter (no raw JSON column); `x` as integers, `lr`
    /// to at most 4 significant digits, each number on one line.
    async fn check_parameter_columns(&self) {
        let columns = self
            .wait_for(
                "one column per parameter",
                "return [...document.querySelectorAll('#trials thead th')].map((th) => th.textContent)",
                |titles| {
                    let titles = titles.as_array().cloned().unwrap_or_default();
                    ["x", "lr", "tag"].iter().all(|name| titles.contains(&json!(name)))
                },
            )
            .await;
        assert!(
            !columns.as_array().unwrap().contains(&json!("Config")),
            "{columns}"
        );
        let cells = self
            .value(
                "const titles = [...document.querySelectorAll('#trials thead th')].map((th) => th.textContent); \
                 const column = (name) => [...document.querySelectorAll('#trials tbody tr')].map((tr) => tr.children[titles.indexOf(name)]); \
                 const lines = (td) => { const range = document.createRange(); range.selectNodeContents(td); \
                   return new Set([...range.getClientRects()].map((rect) => Math.round(rect.top))).size; }; \
                 return ['x', 'lr'].map((name) => column(name).map((td) => [td.textContent, lines(td)]))",
            )
            .await;
        let [x, lr] = [&cells[0], &cells[1]];
        for cell in x.as_array().unwrap() {
            assert!(["1", "2", "3"].contains(&cell[0].as_str().unwrap()), "{x}");
        }
        for cell in lr.as_array().unwrap() {
            let text = cell[0].as_str().unwrap();
            let mantissa = text.split('e').next().unwrap();
            let digits = mantissa.trim_start_matches(['0', '.']).replace('.', "");
            assert!(
                digits.len() <= 4 && !digits.is_empty(),
                "lr shown as {text}"
            );
            assert_eq!(cell[1], json!(1), "{text} is wrapped");
        }
    }

    /// A learning curve per trial, the configuration's HTML shown as text in
    /// the table and the legend, and the legend clear of the x axis title.
    async fn check_curves_and_hostile_text(&self) {
        self.wait_for(
            "one learning curve per trial",
            "const gd = document.getElementById('curves'); return gd && gd.data ? gd.data.length : -1",
            |series| series.as_u64() == Some(TRIALS as u64),
        )
        .await;
        self.wait_text("#trials", HOSTILE).await;
        self.wait_for(
            "the configuration's HTML as text in the curves' legend",
            "return [...document.querySelectorAll('#curves .legendtext')].map((e) => e.textContent).join('|')",
            |text| text.as_str().is_some_and(|text| text.contains("<img src=x")),
        )
        .await;
        self.check_legend_clear_of_axis_title("curves").await;
    }

    /// The legend's box and the x axis title's do not overlap.
    async fn check_legend_clear_of_axis_title(&self, chart: &str) {
        let boxes = self
            .value(&format!(
                "const gd = document.getElementById({chart:?}); \
                 const rect = (node) => {{ const r = node.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }}; \
                 return [rect(gd.querySelector('.legend')), rect(gd.querySelector('.g-xtitle'))]"
            ))
            .await;
        let edges = |index: usize| -> Vec<f64> {
            boxes[index]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        };
        let (legend, title) = (edges(0), edges(1));
        let apart = legend[3] <= title[1]
            || title[3] <= legend[1]
            || legend[2] <= title[0]
            || title[2] <= legend[0];
        assert!(
            apart,
            "{chart}: the legend {legend:?} covers the axis title {title:?}"
        );
    }
}

impl Page<'_> {
    /// Importance names its method and rates every parameter; the scatter
    /// starts on the most important and draws `lr` on a log axis.
    async fn check_importance_and_scatter(&self) {
        self.wait_text("#importance", "Method: PED-ANOVA").await;
        let ranked = self
            .wait_for(
                "a rating per parameter",
                "return [...document.querySelectorAll('#importance table.importance tbody tr')].map((tr) => tr.children[0].textContent)",
                |names| names.as_array().is_some_and(|names| names.len() == 3),
            )
            .await;
        self.wait_for(
            "the scatter on the most important parameter",
            "const gd = document.getElementById('search'); \
             return [document.getElementById('search-param').value, gd && gd.data ? gd.data[0].y.length : -1]",
            |found| *found == json!([ranked[0], TRIALS]),
        )
        .await;
        for (param, axis) in [("lr", "log"), ("x", "linear")] {
            self.value(&format!(
                "const select = document.getElementById('search-param'); select.value = {param:?}; \
                 select.dispatchEvent(new Event('change')); return true"
            ))
            .await;
            self.wait_for(
                &format!("{param} on a {axis} axis"),
                "const gd = document.getElementById('search'); return gd._fullLayout.xaxis.type",
                |found| found.as_str() == Some(axis),
            )
            .await;
        }
        self.value(
            "const select = document.getElementById('search-param'); select.value = 'lr'; \
             select.dispatchEvent(new Event('change')); return true",
        )
        .await;
        self.screenshot_at("#importance", "importance-and-scatter")
            .await;
    }

    /// Parallel coordinates: one dimension per parameter plus the metric;
    /// a constraint range on the metric keeps the trials within it, and the
    /// panel says which.
    async fn check_parallel_coordinates(&self) {
        let labels = self
            .wait_for(
                "the parallel coordinates",
                "const gd = document.getElementById('parcoords'); \
                 return gd && gd.data && gd.data[0] && gd.data[0].type === 'parcoords' ? gd.data[0].dimensions.map((d) => d.label) : null",
                Value::is_array,
            )
            .await;
        assert_eq!(labels, json!(["lr (log)", "tag", "x", "loss"]));
        let expected = self
            .value(
                "const gd = document.getElementById('parcoords'); \
                 Plotly.restyle(gd, {'dimensions[3].constraintrange': [[0, 25]]}); \
                 return gd.data[0].dimensions[3].values.filter((v) => v <= 25).length",
            )
            .await;
        let expected = expected.as_u64().expect("a count");
        assert!(expected >= 1, "some trial has x = 1");
        self.wait_text(
            "#parcoords-count",
            &format!("{expected} of {TRIALS} trials in the chosen ranges"),
        )
        .await;
        self.screenshot_at("#parcoords", "parcoords").await;
    }

    /// Ticking two trials shows them side by side: a column each, a row per
    /// parameter, and a curve each.
    async fn check_side_by_side(&self) {
        self.wait_text("#compare-note", "Tick 2 to 4 trials").await;
        for index in 0..2 {
            let boxes = self
                .client
                .find_all(fantoccini::Locator::Css("#trials input.pick"))
                .await
                .expect("the trials' boxes");
            boxes[index].click().await.expect("tick a trial");
        }
        let header = self
            .wait_for(
                "two trials side by side",
                "return [...document.querySelectorAll('#compare-table thead th')].map((th) => th.textContent)",
                |titles| titles.as_array().is_some_and(|titles| titles.len() == 3),
            )
            .await;
        assert_eq!(header[1], "t0", "{header}");
        let rows = self
            .value("return [...document.querySelectorAll('#compare-table tbody th')].map((th) => th.textContent)")
            .await;
        for row in ["state", "outcome", "loss", "x", "lr", "tag"] {
            assert!(
                rows.as_array().unwrap().contains(&json!(row)),
                "{row}: {rows}"
            );
        }
        self.wait_for(
            "a curve per chosen trial",
            "const gd = document.getElementById('compare-curves'); return gd && gd.data ? gd.data.length : -1",
            |series| series.as_u64() == Some(2),
        )
        .await;
        self.check_legend_clear_of_axis_title("compare-curves")
            .await;
        self.screenshot_at("#compare-note", "compare").await;
    }

    /// The trial's page: its id, its followed log and its loss curve.
    pub(crate) async fn check_trial(&self, trial: &str) {
        self.open(&format!("/trials/{trial}")).await;
        self.wait_for(
            "the trial's id",
            "return document.getElementById('trial-id').textContent",
            |text| text.as_str() == Some(trial),
        )
        .await;
        self.wait_for(
            "its log, followed",
            "return document.getElementById('log').textContent",
            |text| {
                text.as_str()
                    .is_some_and(|text| text.contains("XP_METRIC") && text.contains("done"))
            },
        )
        .await;
        self.wait_for(
            "its loss curve",
            "const gd = document.querySelector('#trial-curves .js-plotly-plot'); return gd && gd.data ? gd.data[0].x.length : -1",
            |points| points.as_i64() == Some(5),
        )
        .await;
        self.done("trial").await;
    }

    /// The queues page; the nodes page naming the held trial on its GPU by
    /// its id; the cluster page with its charts from zero.
    pub(crate) async fn check_queues_nodes_and_cluster(&self, held: &str) {
        self.open("/queues").await;
        self.wait_text("main table", "default").await;
        self.done("queues").await;

        self.open("/nodes").await;
        let labels = self
            .wait_for(
                "the held trial on a GPU slot",
                "return [...document.querySelectorAll('.slot a')].map((a) => a.textContent)",
                |labels| labels.as_array().is_some_and(|labels| !labels.is_empty()),
            )
            .await;
        assert_eq!(labels, json!([held]), "a slot names its trial by id");
        self.done("nodes").await;

        self.open("/cluster").await;
        self.wait_for(
            "the utilisation chart",
            "const gd = document.getElementById('utilization'); return gd && gd.data ? gd.data.length : -1",
            |series| series.as_i64() == Some(2),
        )
        .await;
        self.wait_for(
            "GPU-hours of the default team",
            "const gd = document.getElementById('gpu-hours-by-team'); return gd && gd.data ? gd.data[0].x : []",
            |teams| teams.as_array().is_some_and(|teams| teams.contains(&json!("default"))),
        )
        .await;
        self.check_y_axes_from_zero(&CLUSTER_CHARTS).await;
        self.done("cluster").await;
    }
}
