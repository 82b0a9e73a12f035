//! The subc modules broca's test double stands in for, besides the tool provider
//! (`broca-mock-tools`): the claustrum vault ([`vault`]), the fusiform catalog ([`fusiform`]) and
//! a relay that calls broca under its own principal ([`relay`]). The `broca-mock` binary is
//! their command line.

pub mod fusiform;
pub mod relay;
pub mod vault;
