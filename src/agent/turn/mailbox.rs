//! The run's mailbox: commands sent to the session while its run goes on (cancels, seals,
//! sends the actor decides), handled at the loop's points of interest.

use super::*;

/// How long a run whose tool batch ended without answers waits for broca's own stop before it
/// ends as a timeout (`Driver::await_seal`).
pub(super) const SEAL_GRACE: Duration = Duration::from_secs(1);

impl<C> Driver<'_, C> {
    /// Records a cancel request durably (the "ack" is only true after this).
    pub(super) fn request_cancel(&mut self, at: CancelAt) -> Result<(), LineageError> {
        self.lineage.append(&Record::RunCancelRequested { run_id: self.run_id.clone(), at })?;
        self.commit()
    }

    pub(super) fn cancel_requested(&self) -> Option<CancelAt> {
        self.lineage.state().last.as_ref().and_then(|e| e.cancel)
    }

    /// Handles commands for up to `grace`, returning as soon as one seals the run (at once or
    /// at its boundary: a planned stop either way).
    pub(super) fn await_seal(&mut self, grace: Duration) -> Result<(), LineageError> {
        let until = Instant::now() + grace;
        while !self.sealing && !self.seal_at_boundary {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.commands.recv_timeout(left) {
                Ok(cmd) => {
                    self.command(Ok(cmd))?;
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    self.command(Err(RecvError))?;
                    break;
                }
            }
        }
        Ok(())
    }

    pub(super) fn drain_commands(&mut self) -> Result<(), LineageError> {
        while let Ok(cmd) = self.commands.try_recv() {
            self.command(Ok(cmd))?;
        }
        Ok(())
    }

    /// Handles one command (or the channel's end); returns the cancel mode it asked for.
    pub(super) fn command(&mut self, cmd: Result<C, RecvError>) -> Result<Option<CancelAt>, LineageError> {
        let Ok(cmd) = cmd else {
            // Nobody can send commands any more: stop selecting on a channel that is always ready.
            self.commands = crossbeam_channel::never();
            return Ok(None);
        };
        let before = self.cancel_requested();
        let handled = (self.handle)(self.lineage, cmd);
        if !handled.units.is_empty() {
            (self.out)(Output::Control(handled.units));
        }
        match handled.signal {
            Some(RunCommand::Cancel(at)) => {
                self.request_cancel(at)?;
                Ok(Some(at))
            }
            Some(RunCommand::Seal) => {
                self.sealing = true;
                Ok(Some(CancelAt::Now))
            }
            Some(RunCommand::SealAtBoundary) => {
                self.seal_at_boundary = true;
                Ok(None)
            }
            None => {
                // The command may have recorded a cancel (run.cancel, an interrupting send).
                let after = self.cancel_requested();
                Ok(if after != before { after } else { None })
            }
        }
    }
}
