//! Waiting between retries (a model attempt, a vault read, a Code Assist lookup), hearing the
//! run's commands meanwhile.

use super::*;

impl<C> Driver<'_, C> {
    pub(super) fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let p = &self.opts.retry;
        let exp = p.base_backoff.saturating_mul(1u32 << attempt.min(16));
        exp.max(retry_after.unwrap_or_default()).min(p.max_backoff)
    }

    /// Sleeps for a backoff, answering commands. Returns true when cancelled now.
    pub(super) fn wait_backoff(&mut self, backoff: Duration) -> Result<bool, LineageError> {
        let deadline = Instant::now() + backoff;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let commands = self.commands.clone();
            select! {
                recv(commands) -> cmd => if self.command(cmd)? == Some(CancelAt::Now) {
                    return Ok(true);
                },
                default(left) => return Ok(false),
            }
        }
    }
}
