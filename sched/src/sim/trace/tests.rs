//! Parsing cases of the trace: every column, the errors naming line and
//! column, and the round trip through `Trace::to_csv`.

use super::*;

const HEADER: &str = "job_id,submit_s,duration_s,num_workers,gpus_per_worker";

fn check_error(text: &str, expected: &str) {
    let error = parse_trace(text).expect_err("the trace should be rejected");
    let message = error.to_string();
    assert!(
        message.contains(expected),
        "{message:?} does not contain {expected:?}"
    );
}

fn one(row: &str) -> TraceJob {
    parse_trace(&format!("{HEADER}\n{row}\n"))
        .unwrap()
        .jobs
        .remove(0)
}

#[test]
fn memory_columns_parse_and_bad_values_name_line_and_column() {
    let header = format!("{HEADER},oversubscribe,gpu_mem_peak,gpu_mem_peak_at_s");
    let trace = parse_trace(&format!(
        "{header}\na,0,60,1,0.5,true,0.4,30\nb,0,60,1,1,,,\n"
    ))
    .unwrap();
    let (a, b) = (&trace.jobs[0], &trace.jobs[1]);
    assert!(a.oversubscribe);
    assert_eq!(a.gpu_mem_peak_milli, Some(400));
    assert_eq!(a.gpu_mem_peak_at_ms, Some(30_000));
    assert!(!b.oversubscribe);
    assert_eq!(b.gpu_mem_peak_milli, None);
    let again = parse_trace(&trace.to_csv()).unwrap();
    assert_eq!(again.jobs[0].gpu_mem_peak_milli, Some(400));
    assert_eq!(again.jobs[0].gpu_mem_peak_at_ms, Some(30_000));
    assert!(again.jobs[0].oversubscribe && !again.jobs[1].oversubscribe);
    check_error(
        &format!("{header}\na,0,60,1,0.5,true,1.5,\n"),
        "line 2, column `gpu_mem_peak`: must be a fraction of the GPU's memory above 0 and at most 1",
    );
    check_error(
        &format!("{header}\na,0,60,1,0.5,true,0,\n"),
        "column `gpu_mem_peak`",
    );
    check_error(
        &format!("{header}\na,0,60,1,0.5,true,NaN,\n"),
        "column `gpu_mem_peak`",
    );
    check_error(
        &format!("{header}\na,0,60,1,0.5,maybe,,\n"),
        "line 2, column `oversubscribe`",
    );
    check_error(
        &format!("{header}\na,0,60,1,2,true,,\n"),
        "line 2, column `oversubscribe`: only workers with a fraction of one GPU may oversubscribe it",
    );
    check_error(
        &format!("{header}\na,0,60,1,0.5,,,-3\n"),
        "line 2, column `gpu_mem_peak_at_s`",
    );
}

#[test]
fn required_columns_parse() {
    let job = one("a,1.5,60,2,0.47");
    assert_eq!(job.job_id, "a");
    assert_eq!(job.submit_ms, 1500);
    assert_eq!(job.duration_ms, Some(60_000));
    assert_eq!(job.num_workers, 2);
    assert_eq!(job.gpu_milli_per_worker, 470);
    assert_eq!(job.total_gpu_milli(), 940);
    assert!(job.preemptible);
    assert_eq!(job.priority, None);
    assert_eq!(job.line, 2);
    assert_eq!(one("a,0,,1,8").duration_ms, None);
    assert_eq!(one("a,0,1,1,8").gpu_milli_per_worker, 8000);
    assert_eq!(one("a,0,1,1,0").gpu_milli_per_worker, 0);
    assert_eq!(one("a,0,1,1,1").gpu_milli_per_worker, 1000);
    assert_eq!(one("a,0,1,1,2.0").gpu_milli_per_worker, 2000);
    assert_eq!(one(" a , 0 , 1 , 1 , 0.25 ").gpu_milli_per_worker, 250);
}

#[test]
fn optional_columns_parse() {
    let text = "deps,job_id,submit_s,duration_s,num_workers,gpus_per_worker,cpu_milli_per_worker,mem_mib_per_worker,gpu_types,priority,team,preemptible,time_limit_s,ckpt_interval_s\n\
                ,a,0,10,1,1,4000,1024,A100|H100,high,vision,false,20,5\n\
                a;b0,b,3,,4,0.5,,,,-7,,,,\n\
                ,b0,1,1,1,1,,,,,,no,,\n";
    let trace = parse_trace(text).unwrap();
    let a = &trace.jobs[0];
    assert_eq!(a.cpu_milli_per_worker, 4000);
    assert_eq!(a.mem_mib_per_worker, 1024);
    assert_eq!(a.gpu_types, vec!["A100".to_owned(), "H100".to_owned()]);
    assert_eq!(a.priority, Some(JobPriority::Class("high".to_owned())));
    assert_eq!(trace.teams[a.team as usize], "vision");
    assert!(!a.preemptible);
    assert_eq!(a.time_limit_ms, Some(20_000));
    assert_eq!(a.ckpt_interval_ms, Some(5_000));
    let b = &trace.jobs[1];
    assert_eq!(b.deps, vec![0, 2]);
    assert_eq!(b.priority, Some(JobPriority::Value(-7)));
    assert_eq!(trace.teams[b.team as usize], DEFAULT_TEAM);
    assert!(b.preemptible);
    assert!(!trace.jobs[2].preemptible);
}

#[test]
fn bad_values_of_required_columns_name_line_and_column() {
    check_error(
        &format!("{HEADER}\na,0,1,1,1\nb,x,1,1,1\n"),
        "line 3, column `submit_s`",
    );
    check_error(
        &format!("{HEADER}\na,0,-5,1,1\n"),
        "line 2, column `duration_s`",
    );
    check_error(
        &format!("{HEADER}\na,0,1,0,1\n"),
        "line 2, column `num_workers`",
    );
    check_error(
        &format!("{HEADER}\na,0,1,100001,1\n"),
        "column `num_workers`: must be at most 100000",
    );
    check_error(
        &format!("{HEADER}\na,0,1,1,1.5\n"),
        "more than one GPU must be a whole number",
    );
    check_error(&format!("{HEADER}\na,0,1,1,0.0001\n"), "multiple of 0.001");
    check_error(
        &format!("{HEADER}\na,0,1,1,-1\n"),
        "column `gpus_per_worker`",
    );
    check_error(
        &format!("{HEADER}\na,0,1,1,NaN\n"),
        "column `gpus_per_worker`",
    );
    check_error(&format!("{HEADER}\na,0,1,1,4096\n"), "must be at most 1024");
    check_error(&format!("{HEADER}\na,inf,1,1,1\n"), "column `submit_s`");
    check_error(&format!("{HEADER}\na,1e12,1,1,1\n"), "column `submit_s`");
    check_error(
        &format!("{HEADER}\n,0,1,1,1\n"),
        "column `job_id`: must not be empty",
    );
}

#[test]
fn bad_rows_ids_and_dependencies_name_the_line() {
    check_error(&format!("{HEADER}\na,0,1,1\n"), "line 2");
    check_error(
        &format!("{HEADER}\na,0,1,1,1\na,0,1,1,1\n"),
        "line 3: job id \"a\" is already used on line 2",
    );
    check_error(
        &format!("{HEADER},deps\na,0,1,1,1,zz\n"),
        "line 2, column `deps`: job \"a\" depends on unknown job \"zz\"",
    );
    check_error(
        &format!("{HEADER},deps\na,0,1,1,1,a\n"),
        "cannot depend on itself",
    );
    check_error(&format!("{HEADER}\n"), "no jobs");
}

#[test]
fn bad_optional_columns_and_headers_are_named() {
    check_error(
        &format!("{HEADER},preemptible\na,0,1,1,1,maybe\n"),
        "column `preemptible`",
    );
    check_error(
        &format!("{HEADER},time_limit_s\na,0,1,1,1,0\n"),
        "column `time_limit_s`",
    );
    check_error(
        &format!("{HEADER},priority\na,0,1,1,1,+x\n"),
        "column `priority`",
    );
    check_error(
        &format!("{HEADER},cpu_milli_per_worker\na,0,1,1,1,1.5\n"),
        "column `cpu_milli_per_worker`",
    );
    check_error(
        &format!("{HEADER},gpu_types\na,0,1,1,1,A100||H100\n"),
        "column `gpu_types`",
    );
    check_error(
        "job_id,submit_s,duration_s,num_workers\na,0,1,1\n",
        "no `gpus_per_worker` column",
    );
    check_error(
        &format!("{HEADER},colour\na,0,1,1,1,red\n"),
        "unknown column `colour`",
    );
    check_error(
        &format!("{HEADER},team,team\na,0,1,1,1,x,y\n"),
        "appears twice",
    );
    check_error(
        &format!("{HEADER},estimate_s\na,0,1,1,1,-3\n"),
        "line 2, column `estimate_s`",
    );
    check_error(
        &format!("{HEADER},kind\na,0,1,1,1,\"x\ty\"\n"),
        "column `kind`: must not contain control characters",
    );
}

#[test]
fn csv_round_trips() {
    let text = "job_id,submit_s,duration_s,num_workers,gpus_per_worker,priority,team,time_limit_s,ckpt_interval_s,deps,gpu_types,estimate_s,kind\n\
                a,0.001,10.5,1,0.25,3,x,20,5,,A100,12,prep\n\
                b,2,,16,8,low,y,,,a,,,\n";
    let trace = parse_trace(text).unwrap();
    assert_eq!(trace.jobs[0].estimate_ms, Some(12_000));
    assert_eq!(trace.jobs[0].kind.as_deref(), Some("prep"));
    assert_eq!(
        (trace.jobs[1].estimate_ms, &trace.jobs[1].kind),
        (None, &None)
    );
    let again = parse_trace(&trace.to_csv()).unwrap();
    assert_eq!(trace, again);
}
