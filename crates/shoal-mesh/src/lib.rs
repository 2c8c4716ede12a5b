//! placeholder
pub mod membership;
