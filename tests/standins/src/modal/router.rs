//! `modal.task_command_router.TaskCommandRouter`: execs in a sandbox.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::pb::task_command_router::task_command_router_server::TaskCommandRouter;
use super::pb::task_command_router::task_exec_poll_response::ExitStatus as PollExit;
use super::pb::task_command_router::task_exec_wait_response::ExitStatus as WaitExit;
use super::pb::task_command_router::*;
use super::sandbox::{Exec, ExitKind, write_stdin};
use super::{State, take_one};

/// The largest chunk one stdio message carries.
const CHUNK: usize = 32 * 1024;

/// The router service.
pub struct RouterService(pub Arc<State>);

impl RouterService {
    fn exec(&self, task_id: &str, exec_id: &str) -> Result<Arc<Exec>, Status> {
        let sb = self.0.by_task(task_id)?;
        sb.execs
            .lock()
            .ok()
            .and_then(|e| e.get(exec_id).cloned())
            .ok_or_else(|| Status::not_found(format!("Exec {exec_id} not found")))
    }
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl TaskCommandRouter for RouterService {
    async fn task_exec_start(
        &self,
        r: Request<TaskExecStartRequest>,
    ) -> Result<Response<TaskExecStartResponse>, Status> {
        self.0
            .check_router("TaskExecStart", &r, &r.get_ref().task_id.clone())?;
        let q = r.into_inner();
        if q.exec_id.is_empty() || q.command_args.is_empty() {
            return Err(Status::invalid_argument(
                "exec_id and command_args are required",
            ));
        }
        let sb = self.0.by_task(&q.task_id)?;
        if sb.result().is_some() {
            return Err(Status::failed_precondition(format!(
                "Task {} has finished",
                q.task_id
            )));
        }
        // The client names the exec: starting it again is a no-op.
        if sb.execs.lock().is_ok_and(|e| e.contains_key(&q.exec_id)) {
            return Ok(Response::new(TaskExecStartResponse {}));
        }
        let env: Vec<(String, String)> = q.env.into_iter().collect();
        let pipe_out = q.stdout_config == TaskExecStdoutConfig::Pipe as i32;
        let merge = q.stderr_config == TaskExecStderrConfig::Stdout as i32;
        let pipe_err = q.stderr_config == TaskExecStderrConfig::Pipe as i32;
        let exec = match q.pty_info.as_ref().filter(|p| p.enabled) {
            Some(p) => {
                let size = (
                    u16::try_from(p.winsz_cols).unwrap_or(80).max(1),
                    u16::try_from(p.winsz_rows).unwrap_or(24).max(1),
                );
                sb.start_exec_pty(
                    &q.command_args,
                    q.workdir.as_deref(),
                    &env,
                    size,
                    &p.env_term,
                )
            }
            None => sb.start_exec(
                &q.command_args,
                q.workdir.as_deref(),
                &env,
                pipe_out,
                pipe_err,
                merge,
            ),
        }
        .map_err(|e| {
            Status::failed_precondition(format!(
                "cannot start {:?}: {e}",
                q.command_args.first().cloned().unwrap_or_default()
            ))
        })?;
        if let Ok(mut e) = sb.execs.lock() {
            e.insert(q.exec_id, exec);
        }
        Ok(Response::new(TaskExecStartResponse {}))
    }

    async fn task_exec_stdio_read(
        &self,
        r: Request<TaskExecStdioReadRequest>,
    ) -> Result<Response<Stream_<TaskExecStdioReadResponse>>, Status> {
        self.0
            .check_router("TaskExecStdioRead", &r, &r.get_ref().task_id.clone())?;
        let q = r.into_inner();
        let exec = self.exec(&q.task_id, &q.exec_id)?;
        let fd = if q.file_descriptor == TaskExecStdioFileDescriptor::Stderr as i32 {
            1
        } else {
            0
        };
        // A cut fault applies to this stream if one is due.
        let cut_after = take_one(&self.0.faults.stdio_cuts)
            .then(|| self.0.faults.stdio_cut_after.load(Ordering::SeqCst));
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut offset = usize::try_from(q.offset).unwrap_or(usize::MAX);
        tokio::spawn(async move {
            let mut sent: u64 = 0;
            loop {
                let changed = exec.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let got = {
                    let Ok(o) = exec.out[fd].lock() else { return };
                    if offset > o.data.len() {
                        Err(o.data.len())
                    } else {
                        let end = o.data.len().min(offset + CHUNK);
                        Ok((o.data[offset..end].to_vec(), o.eof))
                    }
                };
                let (chunk, eof) = match got {
                    Ok(c) => c,
                    Err(len) => {
                        let _ = tx
                            .send(Err(Status::out_of_range(format!(
                                "offset {offset} is past the {len} bytes written"
                            ))))
                            .await;
                        return;
                    }
                };
                if chunk.is_empty() {
                    if eof {
                        return;
                    }
                    changed.await;
                    continue;
                }
                let mut data = chunk;
                let mut cut = false;
                if let Some(limit) = cut_after {
                    let room = usize::try_from(limit.saturating_sub(sent)).unwrap_or(usize::MAX);
                    if data.len() >= room {
                        data.truncate(room);
                        cut = true;
                    }
                }
                offset += data.len();
                sent += data.len() as u64;
                if !data.is_empty()
                    && tx
                        .send(Ok(TaskExecStdioReadResponse { data }))
                        .await
                        .is_err()
                {
                    return;
                }
                if cut {
                    let _ = tx
                        .send(Err(Status::unavailable("injected fault: stdio stream cut")))
                        .await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn task_exec_stdin_write(
        &self,
        r: Request<TaskExecStdinWriteRequest>,
    ) -> Result<Response<TaskExecStdinWriteResponse>, Status> {
        self.0
            .check_router("TaskExecStdinWrite", &r, &r.get_ref().task_id.clone())?;
        let q = r.into_inner();
        let exec = self.exec(&q.task_id, &q.exec_id)?;
        write_stdin(&exec, q.offset, &q.data, q.eof)
            .await
            .map_err(Status::out_of_range)?;
        Ok(Response::new(TaskExecStdinWriteResponse {}))
    }

    async fn task_exec_wait(
        &self,
        r: Request<TaskExecWaitRequest>,
    ) -> Result<Response<TaskExecWaitResponse>, Status> {
        self.0
            .check_router("TaskExecWait", &r, &r.get_ref().task_id.clone())?;
        let q = r.into_inner();
        let exec = self.exec(&q.task_id, &q.exec_id)?;
        let mut rx = exec.exit.clone();
        let kind = match rx.wait_for(|e| e.is_some()).await {
            Ok(k) => *k,
            Err(_) => None,
        };
        Ok(Response::new(TaskExecWaitResponse {
            exit_status: kind.map(|k| match k {
                ExitKind::Code(c) => WaitExit::Code(c),
                ExitKind::Signal(s) => WaitExit::Signal(s),
            }),
        }))
    }

    async fn task_exec_poll(
        &self,
        r: Request<TaskExecPollRequest>,
    ) -> Result<Response<TaskExecPollResponse>, Status> {
        self.0
            .check_router("TaskExecPoll", &r, &r.get_ref().task_id.clone())?;
        let q = r.into_inner();
        let exec = self.exec(&q.task_id, &q.exec_id)?;
        let kind = *exec.exit.borrow();
        Ok(Response::new(TaskExecPollResponse {
            exit_status: kind.map(|k| match k {
                ExitKind::Code(c) => PollExit::Code(c),
                ExitKind::Signal(s) => PollExit::Signal(s),
            }),
        }))
    }
}
