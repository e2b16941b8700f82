//! Where conversations come from. Today: Hermes Agent (`state.db`, plus its
//! session files for sessions the database does not hold).

pub mod files;
pub mod hermes;
