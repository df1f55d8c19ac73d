//! What the dashboard's buttons do. Each is a `POST` from one of its own
//! forms, so [`super::auth::check`] has already checked the token, the
//! `Origin` and that the peer is a process of this host outside every
//! sandbox. Each answers with a redirect back to the page (a form works
//! without script, and the back button does not post again).

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use tracing::info;

use super::{Ui, html};

fn conflict(title: &str, e: &anyhow::Error) -> Response {
    html::refused(StatusCode::CONFLICT, title, &berth_client::error_text(e))
}

/// `/approvals/{id}/{approve|deny|always}`.
pub async fn answer(
    State(ui): State<Arc<Ui>>,
    Path((id, answer)): Path<(String, String)>,
) -> Response {
    let Ok(n) = id.parse::<i64>() else {
        return html::not_found("approval", &id);
    };
    let (approve, always) = match answer.as_str() {
        "approve" => (true, false),
        "deny" => (false, false),
        "always" => (true, true),
        other => return html::not_found("answer", other),
    };
    let Some(gate) = ui.rt.gate().cloned() else {
        return html::failed(&anyhow::anyhow!("this server has no policy gate"));
    };
    let policy = ui.policy.clone();
    let u = ui.clone();
    let done = super::data::blocking(&u.rt, move |rt| {
        berth_service::answers::answer(rt.store(), &gate, n, approve, always, policy, "ui")
    })
    .await;
    match done {
        Ok(a) => {
            info!(approval = n, state = %a.approval.state, "answered from the dashboard");
            Redirect::to("/").into_response()
        }
        Err(e)
            if matches!(
                e.downcast_ref::<berth_core::Error>(),
                Some(berth_core::Error::NotFound { .. })
            ) =>
        {
            html::not_found("approval", &id)
        }
        Err(e) => conflict(&format!("Approval #{n} was not answered"), &e),
    }
}

/// `/jobs/{id}/kill`: SIGTERM, then SIGKILL after the grace period.
pub async fn kill(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Response {
    match ui.rt.store().job(&id) {
        Err(berth_core::Error::NotFound { .. }) => return html::not_found("job", &id),
        Err(e) => return html::failed(&e.into()),
        Ok(_) => {}
    }
    match ui.rt.kill_job(&id, berth_core::backend::Signal::Term).await {
        Ok(_) => Redirect::to(&format!("/jobs/{id}")).into_response(),
        Err(e) => conflict(&format!("Job {id} was not killed"), &e.into()),
    }
}

/// `/runs/{id}/resume`: carry the run on, in a process of its own.
pub async fn resume(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Response {
    if let Err(r) = known_run(&ui, &id).await {
        return r;
    }
    match berth_service::detached::start_run(&ui.state_dir, ["--json", "--resume", &id], &id) {
        Ok(pid) => {
            info!(run = %id, pid, "resumed from the dashboard");
            Redirect::to(&format!("/runs/{id}")).into_response()
        }
        Err(e) => conflict(&format!("Run {id} was not resumed"), &e),
    }
}

#[derive(Deserialize)]
pub struct ForkForm {
    at: i64,
}

/// `/runs/{id}/fork` with `at=STEP`: a new run from that step, in a clone
/// of the sandbox as it was then.
pub async fn fork(
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    Form(f): Form<ForkForm>,
) -> Response {
    if let Err(r) = known_run(&ui, &id).await {
        return r;
    }
    let at = f.at.to_string();
    match berth_service::detached::start_run(
        &ui.state_dir,
        ["--json", "--fork", &id, "--at", &at],
        &format!("fork-{id}-{at}"),
    ) {
        Ok(pid) => {
            info!(run = %id, at = f.at, pid, "forked from the dashboard");
            Redirect::to("/").into_response()
        }
        Err(e) => conflict(&format!("Run {id} was not forked"), &e),
    }
}

async fn known_run(ui: &Arc<Ui>, id: &str) -> Result<(), Response> {
    let key = id.to_string();
    match super::data::blocking(&ui.rt, move |rt| {
        Ok(berth_agent::journal::run(rt.store(), &key)?)
    })
    .await
    {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(html::not_found("run", id)),
        Err(e) => Err(html::failed(&e)),
    }
}
