//! tmp
pub mod cli;
pub mod client;
pub mod config;
pub mod files;
pub mod network;
pub mod server;
pub mod storage;
pub mod types;
