//! tmp
pub mod files;
pub mod network;
pub mod storage;
pub mod types;
