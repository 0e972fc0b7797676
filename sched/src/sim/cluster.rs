//! The simulated cluster: a YAML file of node groups, or a CSV file with one node per row.
//!
//! YAML: `nodes: [{count: 4, gpus: 8, gpu_model: A100, cpu_milli: 96000, mem_mib: 786432,
//! labels: {rack: r1}, name: gpu}]` (`count` defaults to 1, `name` names the nodes
//! `gpu-0`, `gpu-1`, ...). CSV: a header, then `node_id,gpus,gpu_model,cpu_milli,mem_mib`
//! and optionally `rack`.
//!
//! Node ids are derived from the node's position, so the same file always gives the
//! same ids. This module only parses text into [`NodeSpec`]s; it does not simulate.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use xp_runtime::ids::NodeId;

use crate::NodeSpec;

/// The most nodes a cluster may have.
pub const MAX_NODES: u64 = 1_000_000;
/// The most GPUs one node may have.
pub const MAX_GPUS_PER_NODE: u32 = 1024;
/// The most CPU thousandths one node may have (a million cores).
pub const MAX_NODE_CPU_MILLI: u64 = 1_000_000_000;
/// The most memory one node may have, in MiB (one PiB).
pub const MAX_NODE_MEM_MIB: u64 = 1 << 30;
/// The largest cluster file accepted, in bytes.
pub const MAX_CLUSTER_BYTES: usize = 256 << 20;

/// Why a cluster file is rejected.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The YAML is malformed or has unknown fields.
    #[error("invalid cluster YAML: {message}")]
    Yaml {
        /// The parser's message, with line and column.
        message: String,
    },
    /// A YAML node group has a bad value.
    #[error("nodes[{group}].{field}: {reason}")]
    Group {
        /// The group's position in `nodes`, from 0.
        group: usize,
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The CSV is malformed.
    #[error("line {line}: {source}")]
    Csv {
        /// The line of the offending record (1 is the header).
        line: u64,
        /// What the CSV reader found.
        #[source]
        source: csv::Error,
    },
    /// The CSV header is not `node_id,gpus,gpu_model,cpu_milli,mem_mib[,rack]`.
    #[error(
        "the cluster CSV header must be node_id,gpus,gpu_model,cpu_milli,mem_mib and optionally rack (got {header:?})"
    )]
    Header {
        /// The header as written.
        header: String,
    },
    /// A CSV value is malformed or out of range.
    #[error("line {line}, column `{column}`: {reason} (got {value:?})")]
    Field {
        /// The line (1 is the header).
        line: u64,
        /// The column.
        column: &'static str,
        /// The value as written, cut to 64 characters.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two nodes share a name.
    #[error("node name {name:?} is used twice")]
    DuplicateNode {
        /// The name.
        name: String,
    },
    /// The cluster has no node, or more than [`MAX_NODES`].
    #[error("a cluster must have between 1 and {MAX_NODES} nodes (got {count})")]
    NodeCount {
        /// How many nodes the file declares.
        count: u64,
    },
    /// The file is larger than [`MAX_CLUSTER_BYTES`].
    #[error("the cluster file is {len} bytes, more than {MAX_CLUSTER_BYTES}")]
    TooLarge {
        /// Its size.
        len: usize,
    },
}

/// The simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Every node, in file order.
    pub nodes: Vec<NodeSpec>,
    /// The nodes' names, parallel to `nodes`.
    pub names: Vec<String>,
}

impl ClusterSpec {
    /// Whole GPUs in the cluster.
    pub fn total_gpus(&self) -> u64 {
        self.nodes.iter().map(|node| u64::from(node.gpus)).sum()
    }

    /// Each node's `rack` label, or `None`.
    pub fn rack_of(&self) -> HashMap<NodeId, Option<&str>> {
        self.nodes
            .iter()
            .map(|node| (node.id, node.labels.get("rack").map(String::as_str)))
            .collect()
    }
}

/// The id of the `position`th node of a simulated cluster.
pub fn sim_node_id(position: usize) -> NodeId {
    NodeId(uuid::Uuid::from_u128(
        0x5100_0000_0000_0000_0000_0000_0000_0000 | position as u128,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    nodes: Vec<NodeGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeGroup {
    #[serde(default = "one")]
    count: u64,
    gpus: u32,
    #[serde(default)]
    gpu_model: Option<String>,
    cpu_milli: u64,
    mem_mib: u64,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    name: Option<String>,
}

fn one() -> u64 {
    1
}

fn check_resources(gpus: u32, cpu_milli: u64, mem_mib: u64) -> Result<(), (&'static str, String)> {
    if gpus > MAX_GPUS_PER_NODE {
        return Err(("gpus", format!("must be at most {MAX_GPUS_PER_NODE}")));
    }
    if cpu_milli > MAX_NODE_CPU_MILLI {
        return Err(("cpu_milli", format!("must be at most {MAX_NODE_CPU_MILLI}")));
    }
    if mem_mib > MAX_NODE_MEM_MIB {
        return Err(("mem_mib", format!("must be at most {MAX_NODE_MEM_MIB}")));
    }
    Ok(())
}

fn node_spec(
    position: usize,
    gpus: u32,
    gpu_model: Option<String>,
    cpu_milli: u64,
    mem_mib: u64,
    labels: BTreeMap<String, String>,
) -> NodeSpec {
    NodeSpec {
        id: sim_node_id(position),
        gpus,
        gpu_model,
        cpu_milli,
        memory_bytes: mem_mib << 20,
        labels,
    }
}

/// Parses a cluster YAML file.
pub fn parse_cluster_yaml(text: &str) -> Result<ClusterSpec, ClusterError> {
    if text.len() > MAX_CLUSTER_BYTES {
        return Err(ClusterError::TooLarge { len: text.len() });
    }
    let file: ClusterFile = serde_saphyr::from_str(text).map_err(|error| ClusterError::Yaml {
        message: error.to_string(),
    })?;
    let mut total: u64 = 0;
    for (group, spec) in file.nodes.iter().enumerate() {
        if spec.count == 0 {
            return Err(ClusterError::Group {
                group,
                field: "count",
                reason: "must be at least 1".to_owned(),
            });
        }
        total = total.saturating_add(spec.count);
        if let Err((field, reason)) = check_resources(spec.gpus, spec.cpu_milli, spec.mem_mib) {
            return Err(ClusterError::Group {
                group,
                field,
                reason,
            });
        }
        if spec.gpu_model.as_deref().is_some_and(str::is_empty) {
            return Err(ClusterError::Group {
                group,
                field: "gpu_model",
                reason: "must not be empty".to_owned(),
            });
        }
    }
    if total == 0 || total > MAX_NODES {
        return Err(ClusterError::NodeCount { count: total });
    }
    let mut cluster = ClusterSpec {
        nodes: Vec::new(),
        names: Vec::new(),
    };
    let mut seen = HashMap::new();
    for (group, spec) in file.nodes.into_iter().enumerate() {
        let prefix = spec.name.clone().unwrap_or_else(|| format!("g{group}"));
        for index in 0..spec.count {
            let name = if spec.count == 1 && spec.name.is_some() {
                prefix.clone()
            } else {
                format!("{prefix}-{index}")
            };
            if seen.insert(name.clone(), ()).is_some() {
                return Err(ClusterError::DuplicateNode { name });
            }
            cluster.nodes.push(node_spec(
                cluster.nodes.len(),
                spec.gpus,
                spec.gpu_model.clone(),
                spec.cpu_milli,
                spec.mem_mib,
                spec.labels.clone(),
            ));
            cluster.names.push(name);
        }
    }
    Ok(cluster)
}

/// Parses a cluster CSV file: `node_id,gpus,gpu_model,cpu_milli,mem_mib[,rack]`.
pub fn parse_cluster_csv(text: &str) -> Result<ClusterSpec, ClusterError> {
    if text.len() > MAX_CLUSTER_BYTES {
        return Err(ClusterError::TooLarge { len: text.len() });
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|source| ClusterError::Csv { line: 1, source })?
        .clone();
    let has_rack = has_rack_column(&header)?;
    let mut cluster = ClusterSpec {
        nodes: Vec::new(),
        names: Vec::new(),
    };
    let mut seen = HashMap::new();
    let mut record = csv::StringRecord::new();
    loop {
        let more = reader
            .read_record(&mut record)
            .map_err(|source| ClusterError::Csv {
                line: source.position().map_or(0, csv::Position::line),
                source,
            })?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, csv::Position::line);
        if cluster.nodes.len() as u64 >= MAX_NODES {
            return Err(ClusterError::NodeCount {
                count: MAX_NODES + 1,
            });
        }
        let row = parse_node_row(&record, line, has_rack)?;
        if seen.insert(row.name.clone(), ()).is_some() {
            return Err(ClusterError::DuplicateNode { name: row.name });
        }
        cluster.nodes.push(node_spec(
            cluster.nodes.len(),
            row.gpus,
            row.gpu_model,
            row.cpu_milli,
            row.mem_mib,
            row.labels,
        ));
        cluster.names.push(row.name);
    }
    if cluster.nodes.is_empty() {
        return Err(ClusterError::NodeCount { count: 0 });
    }
    Ok(cluster)
}

/// Whether a cluster CSV's header, which must be exactly
/// `node_id,gpus,gpu_model,cpu_milli,mem_mib`, ends with `rack`.
fn has_rack_column(header: &csv::StringRecord) -> Result<bool, ClusterError> {
    let names: Vec<&str> = header.iter().collect();
    let base = ["node_id", "gpus", "gpu_model", "cpu_milli", "mem_mib"];
    match names.as_slice() {
        [a, b, c, d, e] if [*a, *b, *c, *d, *e] == base => Ok(false),
        [a, b, c, d, e, "rack"] if [*a, *b, *c, *d, *e] == base => Ok(true),
        _ => Err(ClusterError::Header {
            header: names.join(","),
        }),
    }
}

/// One node of a cluster CSV.
struct NodeRow {
    name: String,
    gpus: u32,
    gpu_model: Option<String>,
    cpu_milli: u64,
    mem_mib: u64,
    labels: BTreeMap<String, String>,
}

/// Reads the node on `line`: a name of 1 to 256 bytes, whole numbers within
/// the node limits, and a rack label when the file has the column.
fn parse_node_row(
    record: &csv::StringRecord,
    line: u64,
    has_rack: bool,
) -> Result<NodeRow, ClusterError> {
    let field = |column: &'static str, value: &str, reason: String| ClusterError::Field {
        line,
        column,
        value: value.chars().take(64).collect(),
        reason,
    };
    let name = &record[0];
    if name.is_empty() || name.len() > 256 {
        return Err(field("node_id", name, "must be 1 to 256 bytes".to_owned()));
    }
    let number = |column: &'static str, value: &str| -> Result<u64, ClusterError> {
        value
            .parse::<u64>()
            .map_err(|_| field(column, value, "not a whole number at least 0".to_owned()))
    };
    let gpus = number("gpus", &record[1])?;
    let gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
    let cpu_milli = number("cpu_milli", &record[3])?;
    let mem_mib = number("mem_mib", &record[4])?;
    if let Err((column, reason)) = check_resources(gpus, cpu_milli, mem_mib) {
        let value = match column {
            "gpus" => &record[1],
            "cpu_milli" => &record[3],
            _ => &record[4],
        };
        return Err(field(column, value, reason));
    }
    let gpu_model = match &record[2] {
        "" => None,
        model => Some(model.to_owned()),
    };
    let mut labels = BTreeMap::new();
    if has_rack && !record[5].is_empty() {
        labels.insert("rack".to_owned(), record[5].to_owned());
    }
    Ok(NodeRow {
        name: name.to_owned(),
        gpus,
        gpu_model,
        cpu_milli,
        mem_mib,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_error(result: Result<ClusterSpec, ClusterError>, expected: &str) {
        let message = result
            .expect_err("the cluster should be rejected")
            .to_string();
        assert!(
            message.contains(expected),
            "{message:?} does not contain {expected:?}"
        );
    }

    #[test]
    fn yaml_groups_expand() {
        let cluster = parse_cluster_yaml(
            "nodes:\n  - {count: 2, gpus: 8, gpu_model: A100, cpu_milli: 96000, mem_mib: 1024, labels: {rack: r1}}\n  - {gpus: 4, cpu_milli: 1000, mem_mib: 1, name: small}\n",
        )
        .unwrap();
        assert_eq!(cluster.nodes.len(), 3);
        assert_eq!(cluster.names, vec!["g0-0", "g0-1", "small"]);
        assert_eq!(cluster.total_gpus(), 20);
        assert_eq!(cluster.nodes[0].memory_bytes, 1024 << 20);
        assert_eq!(
            cluster.nodes[1].labels.get("rack").map(String::as_str),
            Some("r1")
        );
        assert_eq!(cluster.nodes[2].gpu_model, None);
        assert_ne!(cluster.nodes[0].id, cluster.nodes[1].id);
    }

    #[test]
    fn yaml_errors_name_the_field() {
        check_error(
            parse_cluster_yaml("nodes:\n  - {gpus: 8, cpu_milli: 1, mem_mib: 1, colour: red}\n"),
            "colour",
        );
        check_error(
            parse_cluster_yaml("nodes:\n  - {gpus: 8, cpu_milli: 1}\n"),
            "mem_mib",
        );
        check_error(
            parse_cluster_yaml("nodes:\n  - {count: 0, gpus: 8, cpu_milli: 1, mem_mib: 1}\n"),
            "nodes[0].count",
        );
        check_error(
            parse_cluster_yaml("nodes:\n  - {gpus: 5000, cpu_milli: 1, mem_mib: 1}\n"),
            "nodes[0].gpus",
        );
        check_error(
            parse_cluster_yaml("nodes:\n  - {count: 2000000, gpus: 8, cpu_milli: 1, mem_mib: 1}\n"),
            "between 1 and",
        );
        check_error(parse_cluster_yaml("nodes: []\n"), "between 1 and");
    }

    #[test]
    fn csv_rows_parse() {
        let cluster = parse_cluster_csv(
            "node_id,gpus,gpu_model,cpu_milli,mem_mib,rack\na,8,H100,1000,2,r1\nb,0,,1000,2,\n",
        )
        .unwrap();
        assert_eq!(cluster.names, vec!["a", "b"]);
        assert_eq!(cluster.nodes[0].gpu_model.as_deref(), Some("H100"));
        assert_eq!(
            cluster.nodes[0].labels.get("rack").map(String::as_str),
            Some("r1")
        );
        assert!(cluster.nodes[1].labels.is_empty());
        let plain =
            parse_cluster_csv("node_id,gpus,gpu_model,cpu_milli,mem_mib\na,8,H100,1000,2\n")
                .unwrap();
        assert_eq!(plain.nodes.len(), 1);
    }

    #[test]
    fn csv_errors_name_line_and_column() {
        check_error(
            parse_cluster_csv("node_id,gpus,gpu_model,cpu_milli,mem_mib\na,x,H100,1,1\n"),
            "line 2, column `gpus`",
        );
        check_error(
            parse_cluster_csv(
                "node_id,gpus,gpu_model,cpu_milli,mem_mib\na,1,H100,1,1\na,1,H100,1,1\n",
            ),
            "used twice",
        );
        check_error(parse_cluster_csv("node,gpus\na,1\n"), "header");
        check_error(
            parse_cluster_csv("node_id,gpus,gpu_model,cpu_milli,mem_mib\na,1,H100,1\n"),
            "line 2",
        );
        check_error(
            parse_cluster_csv("node_id,gpus,gpu_model,cpu_milli,mem_mib\n"),
            "between 1 and",
        );
    }
}
