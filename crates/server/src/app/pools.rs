//! E17/J5: what the server keeps of its worker pools' task — the bell an enqueue rings so idle
//! workers claim at once, and the task's handle `serve` waits on at shutdown.

use std::sync::{Mutex, PoisonError};

use tokio::task::JoinHandle;

#[derive(Default)]
pub struct Pools {
    /// Rung on every enqueue: idle workers claim at once instead of at their next poll.
    bell: tokio::sync::Notify,
    /// `serve` waits for it to hand back or record every job it holds.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Pools {
    pub fn ring(&self) {
        self.bell.notify_waiters();
    }

    pub async fn rung(&self) {
        self.bell.notified().await;
    }

    pub fn set_task(&self, task: JoinHandle<()>) {
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    pub fn take_task(&self) -> Option<JoinHandle<()>> {
        self.task.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}
