//! The operations served on a session route, spelled once. Every other list is derived from
//! [`Op`]: the module manifest and `role.describe`'s op list (`ops::table`), the per-op
//! counters of `health.check` (`serve`), the owner-only rule (`owner`), and the handler's
//! exhaustive match (`ops`). Adding an op is one row of the `ops!` invocation below and its arm
//! in `Ops::handle_counted`, which the compiler then asks for.

/// What an operation does to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Reads only.
    Query,
    /// May write the session's WAL (the manifest's `mutate`).
    Write,
    /// A long-lived stream (delivered as a watch).
    Stream,
}

/// Whether only the session's owner may call an op (spec §4 sender rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callers {
    /// Anyone the route admits.
    Any,
    /// Only the session's recorded owner; another caller is refused `scope_owner_mismatch`
    /// before its parameters are read.
    Owner,
}

macro_rules! ops {
    ($($variant:ident = $name:literal, $kind:ident, $callers:ident;)*) => {
        /// One served operation.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            $($variant,)*
        }

        impl Op {
            /// Every op, in the order `role.describe` lists them.
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];

            /// The op's method name on the wire.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Op::$variant => $name,)*
                }
            }

            pub const fn kind(self) -> OpKind {
                match self {
                    $(Op::$variant => OpKind::$kind,)*
                }
            }

            pub const fn callers(self) -> Callers {
                match self {
                    $(Op::$variant => Callers::$callers,)*
                }
            }
        }
    };
}

ops! {
    RoleDescribe = "role.describe", Query, Any;
    SessionBaseline = "session.baseline", Query, Owner;
    SessionSend = "session.send", Write, Owner;
    SessionRetract = "session.retract", Write, Owner;
    SessionRead = "session.read", Query, Any;
    SessionHead = "session.head", Query, Any;
    SessionHistory = "session.history", Query, Any;
    RunStatus = "run.status", Query, Any;
    RunResult = "run.result", Query, Any;
    RunCancel = "run.cancel", Write, Owner;
    RunToolCalls = "run.tool_calls", Query, Any;
    SendStatus = "send.status", Query, Any;
    SessionSendStatus = "session.send_status", Query, Any;
    SessionSubscribe = "session.subscribe", Stream, Any;
    SessionWarm = "session.warm", Write, Owner;
    SessionOutputRefs = "session.output_refs", Query, Any;
    SessionOutputRefRead = "session.output_ref_read", Query, Any;
}

/// broca's own management ops, outside the role's op list (`crate::moves`, DESIGN §8): moving a
/// session between hosts. The manifest declares them; `role.describe` does not list them. They
/// live under `move.` so they cannot be taken for llm-runner's ops: the contract's
/// `session.adopt` (§9.5, taking over a person-started session) is another operation, which broca
/// does not serve (#47).
pub const MOVE_EXPORT: &str = "move.export";
pub const MOVE_ADOPT: &str = "move.adopt";
pub const MOVE_LOCATE: &str = "move.locate";
pub const MOVE_OPS: [&str; 3] = [MOVE_EXPORT, MOVE_ADOPT, MOVE_LOCATE];

impl Op {
    /// The op whose method name is `method`.
    pub fn parse(method: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == method)
    }

    /// The op's place in [`Op::ALL`] (a counter's index): `ALL` lists the variants in
    /// declaration order, so the discriminant is the place.
    pub const fn index(self) -> usize {
        self as usize
    }

    pub const fn owner_only(self) -> bool {
        matches!(self.callers(), Callers::Owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_parses_back_from_its_name_and_names_are_unique() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(Op::parse(op.name()), Some(*op));
            assert_eq!(op.index(), i);
        }
        let mut names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
        assert_eq!(Op::parse("session.nope"), None);
    }

    #[test]
    fn the_owner_only_ops_are_the_spec_s_writes_and_the_baseline() {
        let owner: Vec<&str> = Op::ALL.iter().filter(|op| op.owner_only()).map(|op| op.name()).collect();
        assert_eq!(owner, ["session.baseline", "session.send", "session.retract", "run.cancel", "session.warm"]);
    }
}
