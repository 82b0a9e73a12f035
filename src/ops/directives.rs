//! Trailing turn directives (`turn_directives`, llm-runner §9.9): a run admitted with the name
//! `wake` reports, once it completed, the wake tag its final answer ends with. Parsed from the
//! stored final text (text parts joined, reasoning excluded) by the role crate's own parser,
//! never edited; any other state, a run that did not ask, or no tag reports none.

use cortexkit_role_llm_runner::directives::{parse_trailing, Directive, DirectiveName};

use crate::lineage::read;
use crate::lineage::reader::{Reader, Sink, Start};
use crate::lineage::LineageError;
use crate::message::Role;
use crate::record::{FinishReason, Record};

/// The directives `run_id` reports: `None` unless it completed, was admitted with `wake`, and
/// its final answer's text ends with a wake tag (an error tag reports its error).
pub fn of_run(
    reader: &Reader,
    page: &read::TranscriptPage,
    run_id: &str,
    reason: Option<FinishReason>,
) -> Result<Option<Vec<Directive>>, LineageError> {
    if reason != Some(FinishReason::Completed) || !requested(reader, page, run_id)?.contains(&DirectiveName::Wake) {
        return Ok(None);
    }
    let Some((_, message)) = read::last_message_of_run(reader, run_id, Role::Assistant)? else { return Ok(None) };
    Ok(parse_trailing(&message.text()).map(|wake| vec![Directive::from(wake)]))
}

/// The names `run_id` was admitted with: the last episode's from the replay state, an older
/// run's from its `RunStarted`.
fn requested(reader: &Reader, page: &read::TranscriptPage, run_id: &str) -> Result<Vec<DirectiveName>, LineageError> {
    if let Some(e) = page.state.last.as_ref().filter(|e| e.run_id == run_id) {
        return Ok(e.config.config().map(|c| c.directives.clone()).unwrap_or_default());
    }
    struct Started<'a> {
        run_id: &'a str,
        names: Option<Vec<DirectiveName>>,
    }
    impl Sink for Started<'_> {
        fn record(&mut self, _seq: u64, record: &Record) -> bool {
            if let Record::RunStarted(r) = record {
                if r.run_id == self.run_id {
                    self.names = Some(r.config.config().map(|c| c.directives.clone()).unwrap_or_default());
                }
            }
            self.names.is_none()
        }
    }
    let mut sink = Started { run_id, names: None };
    reader.scan(Start::Beginning, &mut sink)?;
    Ok(sink.names.unwrap_or_default())
}
