//! `shoal authority ...`: one region authority replica (`run --config authority.toml`) and its
//! admin commands (`status`, `snapshot save|restore`, `keygen`). Implemented in
//! `shoal-authority-server` (see its `cli` module and docs/adr/0004-authority-raft.md).

pub use shoal_authority_server::cli::{run, AuthorityCmd};
