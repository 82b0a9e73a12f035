//! The answer to a command a session's actor handles: given exactly once, however the
//! command ends.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::wire::{Refusal, RefusalCode};

type Respond<T> = Box<dyn FnOnce(Result<T, Refusal>) + Send>;

/// A reply given exactly once: by the first [`Answer::send`], or, if every handle is dropped
/// unanswered (the session closed before the command ran), with a transient refusal, so no
/// request is left hanging. Clones share the one reply.
pub struct Answer<T>(Arc<Once<T>>);

struct Once<T>(Mutex<Option<Respond<T>>>);

impl<T> Clone for Answer<T> {
    fn clone(&self) -> Self {
        Answer(Arc::clone(&self.0))
    }
}

impl<T> Answer<T> {
    pub fn new(respond: impl FnOnce(Result<T, Refusal>) + Send + 'static) -> Answer<T> {
        Answer(Arc::new(Once(Mutex::new(Some(Box::new(respond))))))
    }

    pub fn send(&self, result: Result<T, Refusal>) {
        if let Some(respond) = self.0 .0.lock().take() {
            respond(result);
        }
    }
}

impl<T> Drop for Once<T> {
    fn drop(&mut self) {
        if let Some(respond) = self.0.get_mut().take() {
            let detail = Some(crate::detail!("class" => "transient"));
            let message = "open failed: the session closed before answering";
            respond(Err(Refusal::new(RefusalCode::OpenFailed, message, detail)));
        }
    }
}
