//! Tests of the Slurm offer: each grant variable, the cgroup's limits, flags
//! winning, and malformed values refused by name.

use super::*;

const GIB: u64 = 1024 * 1024 * 1024;

fn env(pairs: &[(&str, &str)]) -> SlurmEnv {
    SlurmEnv::from_pairs(pairs.iter().copied())
}

fn offer_of(pairs: &[(&str, &str)], cgroup: CgroupLimits) -> SlurmOffer {
    offer(ExplicitFlags::default(), &env(pairs), &cgroup)
        .expect("a valid environment")
        .expect("inside a job")
}

#[test]
fn outside_a_job_nothing_is_detected() {
    // Slurm-looking variables without a job id (a login shell that exported
    // them) change nothing.
    let outside = env(&[("SLURM_CPUS_ON_NODE", "4"), ("CUDA_VISIBLE_DEVICES", "0")]);
    assert_eq!(
        offer(ExplicitFlags::default(), &outside, &CgroupLimits::default()),
        Ok(None)
    );
    assert_eq!(
        offer(
            ExplicitFlags::default(),
            &env(&[(JOB_ID, " ")]),
            &CgroupLimits::default()
        ),
        Ok(None)
    );
}

#[test]
fn a_job_offers_its_grant() {
    let offer = offer_of(
        &[
            (JOB_ID, "4242"),
            ("CUDA_VISIBLE_DEVICES", "2,3"),
            ("SLURM_JOB_GPUS", "5,7"),
            ("SLURM_CPUS_ON_NODE", "8"),
            ("SLURM_MEM_PER_NODE", "16384"),
        ],
        CgroupLimits::default(),
    );
    assert_eq!(offer.job_id, "4242");
    assert_eq!(offer.array_job_id, None);
    // CUDA_VISIBLE_DEVICES numbers the GPUs as the job's processes see them.
    assert_eq!(
        offer.gpus,
        Some(Detected {
            value: vec![2, 3],
            source: "CUDA_VISIBLE_DEVICES"
        })
    );
    assert_eq!(
        offer.cpus,
        Some(Detected {
            value: 8.0,
            source: "SLURM_CPUS_ON_NODE"
        })
    );
    assert_eq!(
        offer.memory_bytes,
        Some(Detected {
            value: 16 * GIB,
            source: "SLURM_MEM_PER_NODE"
        })
    );
}

#[test]
fn gpu_sources_in_order_and_none_without_a_grant() {
    let gpus = |pairs: &[(&str, &str)]| {
        let mut all = vec![(JOB_ID, "1")];
        all.extend_from_slice(pairs);
        offer_of(&all, CgroupLimits::default())
            .gpus
            .expect("detected")
    };
    assert_eq!(
        gpus(&[("SLURM_STEP_GPUS", "1"), ("SLURM_JOB_GPUS", "0,1")]).value,
        vec![1]
    );
    assert_eq!(gpus(&[("SLURM_JOB_GPUS", "0, 1,1")]).value, vec![0, 1]);
    let counted = gpus(&[("SLURM_GPUS_ON_NODE", "3")]);
    assert_eq!(
        (counted.value, counted.source),
        (vec![0, 1, 2], "SLURM_GPUS_ON_NODE")
    );
    // `NoDevFiles`: no ordinals there, so the next variable decides.
    assert_eq!(
        gpus(&[
            ("CUDA_VISIBLE_DEVICES", "NoDevFiles"),
            ("SLURM_JOB_GPUS", "4")
        ])
        .value,
        vec![4]
    );
    // A job granted no GPU offers none, whatever NVML would find on the machine.
    assert!(gpus(&[]).value.is_empty());
    assert!(gpus(&[("SLURM_GPUS_ON_NODE", "0")]).value.is_empty());
    assert!(gpus(&[("CUDA_VISIBLE_DEVICES", "")]).value.is_empty());
}

#[test]
fn the_tightest_limit_wins() {
    let offer = offer_of(
        &[
            (JOB_ID, "7"),
            ("SLURM_CPUS_ON_NODE", "16"),
            ("SLURM_MEM_PER_CPU", "1024"),
        ],
        CgroupLimits {
            cpuset_cpus: Some(4),
            quota_cores: Some(2.5),
            memory_bytes: Some(8 * GIB),
        },
    );
    assert_eq!(
        offer.cpus,
        Some(Detected {
            value: 2.5,
            source: "the cgroup's CPU quota"
        })
    );
    // 16 CPUs at 1 GiB each is more than the cgroup's 8 GiB.
    assert_eq!(
        offer.memory_bytes,
        Some(Detected {
            value: 8 * GIB,
            source: "the cgroup's memory limit"
        })
    );
    let offer = offer_of(
        &[
            (JOB_ID, "7"),
            ("SLURM_CPUS_ON_NODE", "2"),
            ("SLURM_MEM_PER_CPU", "1024"),
        ],
        CgroupLimits {
            cpuset_cpus: Some(4),
            quota_cores: None,
            memory_bytes: Some(8 * GIB),
        },
    );
    assert_eq!(offer.cpus.map(|cpus| cpus.value), Some(2.0));
    assert_eq!(
        offer.memory_bytes,
        Some(Detected {
            value: 2 * GIB,
            source: "SLURM_MEM_PER_CPU times SLURM_CPUS_ON_NODE"
        })
    );
    // With only the cgroup's cpuset (task/cgroup without the variables).
    let offer = offer_of(
        &[(JOB_ID, "7")],
        CgroupLimits {
            cpuset_cpus: Some(3),
            ..CgroupLimits::default()
        },
    );
    assert_eq!(offer.cpus.map(|cpus| cpus.value), Some(3.0));
    assert_eq!(offer.memory_bytes, None);
    // `--mem=0` is the whole node: no limit from Slurm.
    let whole = offer_of(
        &[(JOB_ID, "7"), ("SLURM_MEM_PER_NODE", "0")],
        CgroupLimits::default(),
    );
    assert_eq!(whole.memory_bytes, None);
}

#[test]
fn flags_win_and_skip_their_variables() {
    let pairs = [
        (JOB_ID, "9"),
        ("CUDA_VISIBLE_DEVICES", "GPU-5b1d2c3e"),
        ("SLURM_CPUS_ON_NODE", "many"),
        ("SLURM_MEM_PER_NODE", "lots"),
    ];
    let explicit = ExplicitFlags {
        gpus: true,
        cpus: true,
        memory: true,
    };
    let offer = offer(explicit, &env(&pairs), &CgroupLimits::default())
        .expect("nothing is read for resources a flag sets")
        .expect("inside a job");
    assert_eq!(
        (offer.gpus, offer.cpus, offer.memory_bytes),
        (None, None, None)
    );
}

#[test]
fn malformed_values_are_refused_by_name() {
    let refused = |pairs: &[(&str, &str)]| {
        let mut all = vec![(JOB_ID, "11")];
        all.extend_from_slice(pairs);
        offer(
            ExplicitFlags::default(),
            &env(&all),
            &CgroupLimits::default(),
        )
        .expect_err("malformed")
        .to_string()
    };
    let message = refused(&[("CUDA_VISIBLE_DEVICES", "GPU-5b1d2c3e")]);
    assert!(
        message.contains("CUDA_VISIBLE_DEVICES") && message.contains("--gpus"),
        "{message}"
    );
    assert!(message.contains("job 11"), "{message}");
    let message = refused(&[("SLURM_CPUS_ON_NODE", "0")]);
    assert!(
        message.contains("SLURM_CPUS_ON_NODE") && message.contains("--cpus"),
        "{message}"
    );
    let message = refused(&[("SLURM_MEM_PER_NODE", "16G")]);
    assert!(
        message.contains("SLURM_MEM_PER_NODE") && message.contains("--memory"),
        "{message}"
    );
    let message = refused(&[("SLURM_MEM_PER_NODE", &u64::MAX.to_string())]);
    assert!(message.contains("64 bits"), "{message}");
    let message = refused(&[("SLURM_GPUS_ON_NODE", "100000")]);
    assert!(message.contains("SLURM_GPUS_ON_NODE"), "{message}");
    let many: Vec<String> = (0..300).map(|index| index.to_string()).collect();
    let message = refused(&[("SLURM_JOB_GPUS", &many.join(","))]);
    assert!(message.contains("at most 256"), "{message}");
    // A long value is cut in the message.
    let long = "x".repeat(10_000);
    assert!(refused(&[("SLURM_CPUS_ON_NODE", &long)]).len() < 400);
}

#[test]
fn array_tasks_name_their_array() {
    let offer = offer_of(
        &[(JOB_ID, "105"), ("SLURM_ARRAY_JOB_ID", "100")],
        CgroupLimits::default(),
    );
    assert_eq!(offer.job_id, "105");
    assert_eq!(offer.array_job_id.as_deref(), Some("100"));
}

#[test]
fn kernel_file_parsers() {
    assert_eq!(cpuset_count("0-3,8,10-11\n"), Some(7));
    assert_eq!(cpuset_count("5"), Some(1));
    assert_eq!(cpuset_count(""), None);
    assert_eq!(cpuset_count("3-1"), None);
    assert_eq!(cpuset_count("a-b"), None);
    assert_eq!(v2_quota_cores("250000 100000\n"), Some(2.5));
    assert_eq!(v2_quota_cores("max 100000\n"), None);
    assert_eq!(v1_quota_cores("-1\n", "100000\n"), None);
    assert_eq!(v1_quota_cores("50000\n", "100000\n"), Some(0.5));
    assert_eq!(memory_limit("max\n"), None);
    assert_eq!(memory_limit("9223372036854771712\n"), None);
    assert_eq!(memory_limit("8589934592\n"), Some(8 * GIB));
}

#[test]
fn this_machine_reads_without_panicking() {
    // Whatever the machine's cgroups are, reading them gives sane numbers or none.
    let limits = read_cgroup_limits();
    assert!(limits.cpuset_cpus.is_none_or(|cpus| cpus > 0));
    assert!(limits.quota_cores.is_none_or(|cores| cores > 0.0));
    assert!(limits.memory_bytes.is_none_or(|bytes| bytes > 0));
}
