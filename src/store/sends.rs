//! The send ledger's rows: how one is looked up, and where a send stands.

/// How a ledger row is looked up.
#[derive(Clone, Copy, Debug)]
pub enum SendLookup<'a> {
    Submission(&'a str),
    /// The newest send under `send_id` in one sender's namespace (`principal`: a plan-named
    /// sender's module; `None`: the owner's).
    SendId {
        send_id: &'a str,
        principal: Option<&'a str>,
    },
}

/// Where a durably queued send stands (the ledger's `fate` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Queued, not yet consumed.
    Pending,
    /// Consumed by the `RunStarted` of its own run.
    Started,
    /// Delivered into a running run as a steer.
    Delivered,
    Retracted,
    /// A waiting `delivery_order` send another with its `dedupe_key` replaced.
    Superseded,
    /// A waiting `delivery_order` send past its `expires_at_ms`.
    Expired,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Pending => "pending",
            Fate::Started => "started",
            Fate::Delivered => "delivered",
            Fate::Retracted => "retracted",
            Fate::Superseded => "superseded",
            Fate::Expired => "expired",
        }
    }

    /// The fate of a list send dropped for `reason`.
    pub fn dropped(reason: crate::record::DropReason) -> Fate {
        match reason {
            crate::record::DropReason::Superseded => Fate::Superseded,
            crate::record::DropReason::Expired => Fate::Expired,
        }
    }

    pub(super) fn parse(s: &str) -> Option<Fate> {
        [Fate::Pending, Fate::Started, Fate::Delivered, Fate::Retracted, Fate::Superseded, Fate::Expired]
            .into_iter()
            .find(|f| f.as_str() == s)
    }
}

/// A send's row in the ledger.
#[derive(Clone, Debug, PartialEq)]
pub struct SendRow {
    pub submission_id: String,
    pub request: crate::record::RequestIdentity,
    pub fate: Fate,
    /// The run that consumed it (`Started`, `Delivered`).
    pub run_id: Option<String>,
}
