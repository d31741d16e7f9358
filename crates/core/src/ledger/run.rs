//! L8–L13: running one row's function safely.

use super::{Row, RowState};
use crate::Ts;
use crate::manifest::spec::FunctionMode;
use crate::present::cut;

/// Who asked for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A person: ▶AI実行 (runRequested) or `ledger run ID`.
    Manual,
    /// The auto-execute schedule.
    Auto,
}

/// Why a row was not run; the text is the `skipped` reason shown to people.
pub type ClaimError = String;

pub const MAX_FAILURES: u32 = 3;
pub const MAX_INSTRUCTION_CHARS: usize = 4000;

/// L8/L9: the row as written *before* its function starts: running, executedAt = now,
/// runRequested cleared. `mode` is the row's Function's mode, None if no such Function exists.
pub fn plan_claim(row: &Row, mode: Option<FunctionMode>, trigger: Trigger, now: Ts) -> Result<Row, ClaimError> {
    match row.state {
        RowState::Todo => {}
        RowState::Review if trigger == Trigger::Manual => {}
        RowState::Running => return Err(format!("{} is already running (since {:?})", row.id, row.executed_at)),
        s => {
            return Err(format!("{} is {s} ({}); only todo rows run, or review rows a person re-runs", row.id, s.ja()));
        }
    }
    if row.function.trim().is_empty() {
        return Err(format!("{} has no function: it is a task for a person", row.id));
    }
    match (mode, trigger) {
        (None, _) => {
            Err(format!("{}: function {:?} is not defined; apply a Function of that name", row.id, row.function))
        }
        (Some(FunctionMode::Heavy), _) => Err(format!(
            "{}: {:?} is a heavy function; heavy work runs from the job queue (`pcmail-ctl jobs enqueue --function {}`), never from the ledger",
            row.id, row.function, row.function
        )),
        (Some(FunctionMode::Send), Trigger::Auto) => Err(format!(
            "{}: {:?} sends outside (mail, orders, requests); it runs only when a person ticks ▶AI実行",
            row.id, row.function
        )),
        _ => Ok(Row { state: RowState::Running, executed_at: Some(now), run_requested: false, ..row.clone() }),
    }
}

/// L9: a heavy row is handed to the job queue instead of running: the tick is cleared and the
/// result says which job on which queue carries it; the row stays todo until the job ends.
pub fn plan_handoff(row: &Row, job_id: &str, queue: &str) -> Row {
    Row {
        run_requested: false,
        result: format!("heavy: runs as job {job_id} on queue {queue} (pcmail-ctl jobs list --queue {queue})"),
        ..row.clone()
    }
}

/// L9: whether a run of `row` goes to the job queue: a person's run of a todo row whose
/// Function is heavy (the claim refuses heavy rows from any other path).
pub fn hands_off(row: &Row, mode: Option<FunctionMode>, trigger: Trigger) -> bool {
    mode == Some(FunctionMode::Heavy) && trigger == Trigger::Manual && row.state == RowState::Todo
}

/// L9: the queue a heavy row's job goes to, of those the WorkerPools serve: `heavy` when one
/// serves it, else the first.
pub fn heavy_queue<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let served: Vec<&str> = served.into_iter().collect();
    served.iter().find(|q| **q == "heavy").or(served.first()).copied()
}

/// L14: whether a pass of `trigger` takes up `row`: execute-checked the rows a person ticked,
/// auto-execute the todo rows of generate Functions (never send or heavy ones).
pub fn runs_in_pass(row: &Row, mode: Option<FunctionMode>, trigger: Trigger) -> bool {
    match trigger {
        Trigger::Manual => row.run_requested,
        Trigger::Auto => row.state == RowState::Todo && mode == Some(FunctionMode::Generate),
    }
}

/// L14: a ticked row a pass could not run has its tick cleared (the reason goes on its trail),
/// so it is not tried again every pass; a running row keeps its tick for after the run.
pub fn plan_skip(row: &Row) -> Option<Row> {
    (row.run_requested && row.state != RowState::Running).then(|| Row { run_requested: false, ..row.clone() })
}

/// L12/L13/L10: the row once the run that claimed it at `claimed_at` ended with `outcome`
/// (stdout, or why it failed) — None unless the row is still that claim: stale recovery or a
/// person may have moved it meanwhile, and theirs stands.
pub fn plan_result(current: &Row, claimed_at: Option<Ts>, outcome: Result<&str, &str>) -> Option<Row> {
    if current.state != RowState::Running || current.executed_at != claimed_at {
        return None;
    }
    Some(match outcome {
        Ok(stdout) => plan_success(current, stdout),
        Err(error) => plan_failure(current, error),
    })
}

/// L16 set-row: what a person changes on a row; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Edit {
    pub state: Option<RowState>,
    pub instruction: Option<String>,
    pub run: Option<bool>,
    pub due: Option<String>,
    pub assignee: Option<String>,
}

/// A state a person may not set on a row: not a state at all, or the runner's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEditState {
    #[error(transparent)]
    Unknown(#[from] crate::names::UnknownName),
    #[error("running is set by the runner, not by hand")]
    Running,
}

impl Edit {
    /// The state a person asks for: any but running, which only the runner sets (L8).
    pub fn state(text: Option<&str>) -> Result<Option<RowState>, BadEditState> {
        match text.map(str::parse::<RowState>).transpose()? {
            Some(RowState::Running) => Err(BadEditState::Running),
            state => Ok(state),
        }
    }
}

/// L16: the row after a person's edit.
pub fn plan_edit(row: &Row, edit: Edit) -> Row {
    let mut next = row.clone();
    next.state = edit.state.unwrap_or(next.state);
    next.instruction = edit.instruction.unwrap_or(next.instruction);
    next.run_requested = edit.run.unwrap_or(next.run_requested);
    next.due = edit.due.unwrap_or(next.due);
    next.assignee = edit.assignee.unwrap_or(next.assignee);
    next
}

/// L9/E11: the job a handed-off row still waits for, if any: what a pass looks up to settle a
/// row whose job ended while the row's own write failed (the job committed, the row did not).
pub fn awaited_job(row: &Row) -> Option<&str> {
    let rest = row.result.strip_prefix("heavy: runs as job ")?;
    let id = rest.split(' ').next().filter(|id| !id.is_empty())?;
    (row.state == RowState::Todo && awaits_job(row, id)).then_some(id)
}

/// T3: whether `row` is waiting for exactly the job `job_id` (handed off by [`plan_handoff`] and
/// not changed since): only then may that job's end be written on it.
pub fn awaits_job(row: &Row, job_id: &str) -> bool {
    row.state == RowState::Todo && row.result.starts_with(&format!("heavy: runs as job {job_id} "))
}

/// The ledger reference a heavy row's job carries: `project/id`.
pub fn ledger_ref(row: &Row) -> String {
    format!("{}/{}", row.project, row.id)
}

/// L13: stdout (`{"result": …, "link": …}` or plain text) becomes the result; the row goes to
/// review for a person.
pub fn plan_success(row: &Row, stdout: &str) -> Row {
    let text = stdout.trim();
    let result = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(o)) if o.contains_key("result") => {
            let as_text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), String::from);
            let mut r = o.get("result").map(as_text).unwrap_or_default();
            if let Some(link) = o.get("link").filter(|l| !l.is_null()) {
                r = format!("{r}\n{}", as_text(link));
            }
            r
        }
        _ => text.to_string(),
    };
    Row { state: RowState::Review, result: cut(&result, 20_000), ..row.clone() }
}

/// L10: a failure counts and stops (no retry); the third one hands the row to a person.
pub fn plan_failure(row: &Row, error: &str) -> Row {
    let failures = row.failures + 1;
    let state = if failures >= MAX_FAILURES { RowState::NeedsHuman } else { RowState::Todo };
    Row { state, failures, result: cut(&format!("failed ({failures}/{MAX_FAILURES}): {error}"), 2000), ..row.clone() }
}

/// L11: a row left running longer than `stale_after` was killed: that counts as a timeout
/// failure before it may run again.
pub fn plan_stale(row: &Row, stale_after: crate::duration::Dur, now: Ts) -> Option<Row> {
    let stale = row.state == RowState::Running && row.executed_at.is_none_or(|t| now >= t + stale_after.to_chrono());
    stale.then(|| {
        plan_failure(
            row,
            &format!("timed out: running since {:?} and never finished (killed or lost)", row.executed_at),
        )
    })
}

/// L12: the prompt on the function's stdin; the row's correction instruction is its last,
/// highest-priority section, for this run only.
pub fn build_prompt(row: &Row) -> String {
    let mut p = format!("# Task {} of project {}\n\nTask: {}\n", row.id, row.project, row.task);
    for (label, value) in [
        ("Content", &row.content),
        ("Evidence", &row.evidence),
        ("Due", &row.due),
        ("Assignee", &row.assignee),
        ("Previous result", &row.result),
    ] {
        if !value.trim().is_empty() {
            p += &format!("{label}: {value}\n");
        }
    }
    let instruction = cut(row.instruction.trim(), MAX_INSTRUCTION_CHARS);
    if !instruction.is_empty() {
        p += &format!(
            "\n## Additional correction instruction — highest priority\n(A person wrote this about the previous result. Apply it first.)\n{instruction}\nWhere it contradicts the usual way of writing, follow this instruction.\n"
        );
    }
    p
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::row;
    use super::*;
    use crate::mail::fixtures::at;

    fn runnable() -> Row {
        let mut r = row(1, "s", "draft the estimate", RowState::Todo);
        r.function = "draft".into();
        r.run_requested = true;
        r
    }

    #[test]
    fn l9_only_a_persons_run_of_a_todo_heavy_row_is_handed_off_to_the_heavy_queue_first() {
        let heavy = Some(FunctionMode::Heavy);
        assert!(hands_off(&runnable(), heavy, Trigger::Manual));
        assert!(!hands_off(&runnable(), heavy, Trigger::Auto));
        assert!(!hands_off(&runnable(), Some(FunctionMode::Generate), Trigger::Manual));
        assert!(!hands_off(&Row { state: RowState::Review, ..runnable() }, heavy, Trigger::Manual));
        assert_eq!(heavy_queue(["default", "heavy"]), Some("heavy"));
        assert_eq!(heavy_queue(["default", "bulk"]), Some("default"));
        assert_eq!(heavy_queue([]), None);
    }

    #[test]
    fn l14_execute_checked_takes_ticked_rows_and_auto_execute_todo_generate_rows_only() {
        let ticked = runnable();
        let unticked = Row { run_requested: false, ..runnable() };
        for (row, mode, trigger, runs) in [
            (&ticked, Some(FunctionMode::Send), Trigger::Manual, true),
            (&unticked, Some(FunctionMode::Generate), Trigger::Manual, false),
            (&unticked, Some(FunctionMode::Generate), Trigger::Auto, true),
            (&unticked, Some(FunctionMode::Send), Trigger::Auto, false),
            (&unticked, Some(FunctionMode::Heavy), Trigger::Auto, false),
            (&unticked, None, Trigger::Auto, false),
            (&Row { state: RowState::Review, ..unticked.clone() }, Some(FunctionMode::Generate), Trigger::Auto, false),
        ] {
            assert_eq!(runs_in_pass(row, mode, trigger), runs, "{:?} {mode:?} {trigger:?}", row.state);
        }
        assert_eq!(plan_skip(&ticked).map(|r| r.run_requested), Some(false));
        assert_eq!(plan_skip(&unticked), None);
        assert_eq!(plan_skip(&Row { state: RowState::Running, ..ticked }), None);
    }

    #[test]
    fn l12_a_result_is_written_only_on_the_claim_it_belongs_to() {
        let claimed = plan_claim(&runnable(), Some(FunctionMode::Generate), Trigger::Manual, at(5)).expect("claims");
        let done = plan_result(&claimed, Some(at(5)), Ok("the draft")).expect("same claim");
        assert_eq!((done.state, done.result.as_str()), (RowState::Review, "the draft"));
        let failed = plan_result(&claimed, Some(at(5)), Err("exit 1")).expect("same claim");
        assert_eq!((failed.state, failed.failures), (RowState::Todo, 1));
        assert_eq!(plan_result(&claimed, Some(at(4)), Ok("late")), None, "a later claim's row");
        let moved = Row { state: RowState::Done, ..claimed };
        assert_eq!(plan_result(&moved, Some(at(5)), Ok("late")), None, "a person moved it");
    }

    #[test]
    fn l16_an_edit_changes_only_the_fields_it_names_and_never_sets_running() {
        let row = runnable();
        let edited = plan_edit(&row, Edit { instruction: Some("shorter".into()), run: Some(false), ..Edit::default() });
        assert_eq!((edited.instruction.as_str(), edited.run_requested), ("shorter", false));
        assert_eq!((edited.state, edited.task.as_str()), (row.state, row.task.as_str()));
        assert_eq!(Edit::state(Some("完了")), Ok(Some(RowState::Done)));
        assert_eq!(Edit::state(None), Ok(None));
        assert_eq!(Edit::state(Some("running")), Err(BadEditState::Running));
        assert_eq!(BadEditState::Running.to_string(), "running is set by the runner, not by hand");
        assert!(Edit::state(Some("finished")).is_err());
    }

    #[test]
    fn l8_claim_writes_running_executed_at_and_clears_run_requested_before_the_run() {
        let claimed = plan_claim(&runnable(), Some(FunctionMode::Generate), Trigger::Manual, at(5)).expect("claims");
        assert_eq!(
            (claimed.state, claimed.executed_at, claimed.run_requested),
            (RowState::Running, Some(at(5)), false)
        );
        let again = plan_claim(&claimed, Some(FunctionMode::Generate), Trigger::Manual, at(6));
        assert!(again.is_err_and(|e| e.contains("already running")), "a claimed row cannot be claimed twice");
    }

    #[test]
    fn l9_send_functions_never_run_automatically_and_heavy_never_from_the_ledger() {
        let r = runnable();
        assert!(plan_claim(&r, Some(FunctionMode::Send), Trigger::Auto, at(1)).is_err_and(|e| e.contains("▶AI実行")));
        assert!(plan_claim(&r, Some(FunctionMode::Send), Trigger::Manual, at(1)).is_ok());
        let heavy = plan_claim(&r, Some(FunctionMode::Heavy), Trigger::Manual, at(1)).expect_err("heavy");
        assert!(heavy.contains("job queue") && heavy.contains("jobs enqueue"), "{heavy}");
        assert!(plan_claim(&r, None, Trigger::Manual, at(1)).is_err_and(|e| e.contains("not defined")));
    }

    #[test]
    fn l9_only_todo_rows_run_and_review_rows_only_when_a_person_asks() {
        let mut r = runnable();
        r.state = RowState::Review;
        assert!(plan_claim(&r, Some(FunctionMode::Generate), Trigger::Auto, at(1)).is_err());
        assert!(plan_claim(&r, Some(FunctionMode::Generate), Trigger::Manual, at(1)).is_ok());
        r.state = RowState::Done;
        assert!(plan_claim(&r, Some(FunctionMode::Generate), Trigger::Manual, at(1)).is_err());
        r.state = RowState::Todo;
        r.function.clear();
        assert!(
            plan_claim(&r, Some(FunctionMode::Generate), Trigger::Manual, at(1))
                .is_err_and(|e| e.contains("for a person"))
        );
    }

    #[test]
    fn l9_a_heavy_row_is_handed_to_the_job_queue_and_says_which_job() {
        let r = plan_handoff(&runnable(), "job-abc", "heavy");
        assert_eq!((r.state, r.run_requested), (RowState::Todo, false));
        assert!(r.result.contains("job-abc") && r.result.contains("queue heavy"), "{}", r.result);
        assert_eq!(ledger_ref(&r), "p/T-0001");
    }

    #[test]
    fn l9_a_row_still_waiting_names_its_job_so_a_pass_can_settle_it_from_the_ended_job() {
        let r = plan_handoff(&runnable(), "job-abc", "heavy");
        assert_eq!(awaited_job(&r), Some("job-abc"));
        assert_eq!(awaited_job(&runnable()), None, "never handed off");
        assert_eq!(awaited_job(&plan_success(&r, "done")), None, "settled");
        let running = Row { state: RowState::Running, ..r };
        assert_eq!(awaited_job(&running), None, "a person ran it since");
    }

    #[test]
    fn t3_only_the_job_a_row_was_handed_to_may_end_it() {
        let r = plan_handoff(&runnable(), "job-abc", "heavy");
        assert!(awaits_job(&r, "job-abc"));
        assert!(!awaits_job(&r, "job-ab"), "a prefix of the id is another job");
        assert!(!awaits_job(&r, "job-xyz"));
        assert!(!awaits_job(&runnable(), "job-abc"), "a row never handed off waits for no job");
        assert!(!awaits_job(&plan_success(&r, "done"), "job-abc"), "a row that moved on waits no more");
    }

    #[test]
    fn l10_a_failure_counts_and_stops_and_the_third_sets_needs_human() {
        let mut r = runnable();
        for n in 1..=3 {
            r = plan_failure(&r, "exit status 1");
            assert_eq!(r.failures, n);
        }
        assert_eq!(r.state, RowState::NeedsHuman);
        assert_eq!(plan_failure(&runnable(), "boom").state, RowState::Todo, "no self-retry: back to todo, stopped");
    }

    #[test]
    fn l11_a_stale_run_counts_one_timeout_failure_then_may_run_again() {
        let claimed = plan_claim(&runnable(), Some(FunctionMode::Generate), Trigger::Manual, at(0)).expect("claim");
        let stale_after = crate::duration::Dur::from_mins(30);
        assert_eq!(plan_stale(&claimed, stale_after, at(30 * 60 - 1)), None);
        let recovered = plan_stale(&claimed, stale_after, at(30 * 60)).expect("stale");
        assert_eq!((recovered.state, recovered.failures), (RowState::Todo, 1));
        assert!(recovered.result.contains("timed out"));
    }

    #[test]
    fn l12_the_instruction_is_the_last_highest_priority_section_of_that_rows_prompt_only() {
        let mut a = runnable();
        a.instruction = "敬語をやめて箇条書きにする".into();
        let b = row(2, "s", "another task", RowState::Todo);
        let pa = build_prompt(&a);
        assert!(pa.trim_end().ends_with("follow this instruction."), "{pa}");
        assert!(pa.contains("highest priority\n(A person") && pa.contains("敬語をやめて箇条書きにする"));
        assert!(!build_prompt(&b).contains("敬語"), "another row's prompt never carries it");
    }

    #[test]
    fn l13_stdout_json_or_text_becomes_the_result_and_the_row_goes_to_review() {
        let r = runnable();
        let json = plan_success(&r, r#"{"result": "draft written", "link": "https://drive/x"}"#);
        assert_eq!((json.state, json.result.as_str()), (RowState::Review, "draft written\nhttps://drive/x"));
        assert_eq!(plan_success(&r, "  plain text answer\n").result, "plain text answer");
    }
}
