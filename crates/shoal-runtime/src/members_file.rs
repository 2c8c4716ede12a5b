//! The address book on disk: `members.json` in the data directory lists live members, seeds
//! and members that went down, each with when it was last seen (unix ms). Both daemons write it
//! with their snapshot tick and at shutdown, read it back at start into the membership's
//! address book (which keeps knocking on them: heals partitions of any length, `shoal-mesh`
//! `membership/reconnect.rs`) and use its freshest entries as extra join seeds. Written
//! atomically (temp file + fsync + rename); a torn or corrupt file is refused whole, entries
//! being only hints.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use shoal_mesh::membership::KnownAddress;
use shoal_proto::NodeId;
use shoal_transport::keyfile::replace_atomic as write_atomic;

/// Last live members.
pub const MEMBERS_FILE: &str = "members.json";
/// Most members persisted (bounds the file and the seed list; the membership's book holds
/// 512 by default, the freshest are kept).
pub const MAX_PERSISTED_MEMBERS: usize = 256;

/// One persisted member (an address-book entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedMember {
    /// Node id (empty for a seed never answered).
    pub node: String,
    /// Listen address.
    pub addr: SocketAddr,
    /// When a member was last active at this address, unix ms (absent in files written
    /// before the address book: read as "now").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_unix_ms: Option<u64>,
}

impl PersistedMember {
    /// From a book entry, `now_unix_ms` being the wall time of the export.
    pub fn from_known(k: &KnownAddress, now_unix_ms: u64) -> Self {
        Self {
            node: k.node.as_ref().map(ToString::to_string).unwrap_or_default(),
            addr: k.addr,
            last_seen_unix_ms: Some(now_unix_ms.saturating_sub(k.unseen_for_ms)),
        }
    }

    /// Back to a book entry (as a non-seed; seeds come from configuration). A node id that
    /// does not parse is dropped, the address kept.
    pub fn to_known(&self, now_unix_ms: u64) -> KnownAddress {
        KnownAddress {
            addr: self.addr,
            node: NodeId::new(&self.node).ok(),
            seed: false,
            unseen_for_ms: self
                .last_seen_unix_ms
                .map_or(0, |t| now_unix_ms.saturating_sub(t)),
        }
    }
}

/// Wall time in unix ms (0 before 1970).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes the live members.
///
/// # Errors
/// IO errors.
pub fn write_members(dir: &Path, members: &[PersistedMember]) -> io::Result<()> {
    let members = &members[..members.len().min(MAX_PERSISTED_MEMBERS)];
    let json = serde_json::to_vec(members).map_err(io::Error::other)?;
    write_atomic(&dir.join(MEMBERS_FILE), &json, 0o600)
}

/// Reads the persisted members; missing or corrupt -> empty (they are only join hints).
pub fn read_members(dir: &Path) -> Vec<PersistedMember> {
    fs::read(dir.join(MEMBERS_FILE))
        .map(|b| parse_members(&b).unwrap_or_default())
        .unwrap_or_default()
}

/// Why `members.json` was not used.
#[derive(Debug, thiserror::Error)]
pub enum MembersFileError {
    /// The file exists but could not be read.
    #[error("cannot read {MEMBERS_FILE}: {0}")]
    Read(#[from] io::Error),
    /// Torn, truncated or not our format: nothing of it is used.
    #[error("{MEMBERS_FILE} is not a valid member list: {0}")]
    Parse(#[from] serde_json::Error),
}

/// Reads the persisted members for the address book. A missing file is an empty list; a
/// torn or corrupt one is an error (the caller logs and counts it, and starts without).
///
/// # Errors
/// [`MembersFileError`]: nothing was read.
pub fn read_members_checked(dir: &Path) -> Result<Vec<PersistedMember>, MembersFileError> {
    match fs::read(dir.join(MEMBERS_FILE)) {
        Ok(b) => Ok(parse_members(&b)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Parses the content of `members.json`, at most [`MAX_PERSISTED_MEMBERS`].
///
/// # Errors
/// The JSON error of a torn or corrupt file.
pub fn parse_members(bytes: &[u8]) -> Result<Vec<PersistedMember>, serde_json::Error> {
    serde_json::from_slice::<Vec<PersistedMember>>(bytes).map(|mut v| {
        v.truncate(MAX_PERSISTED_MEMBERS);
        v
    })
}

/// The membership's address book as it would be persisted, `now_ms` on the mesh clock.
pub fn export_book<V: shoal_catalog::Verifier>(
    mesh: &shoal_mesh::Mesh<V>,
    now_ms: u64,
) -> Vec<PersistedMember> {
    let now_unix = unix_ms(SystemTime::now());
    mesh.membership()
        .known_addresses(now_ms)
        .iter()
        .map(|k| PersistedMember::from_known(k, now_unix))
        .collect()
}

/// Writes `members` unless it is empty (an empty book keeps the previous file: the last known
/// live members stay useful as join hints).
///
/// # Errors
/// IO errors.
pub fn write_book(dir: &Path, members: &[PersistedMember]) -> io::Result<()> {
    if members.is_empty() {
        return Ok(());
    }
    write_members(dir, members)
}

/// The persisted book as address-book entries for `Command::RestoreKnown`.
pub fn to_known(members: &[PersistedMember]) -> Vec<KnownAddress> {
    let now_unix = unix_ms(SystemTime::now());
    members.iter().map(|m| m.to_known(now_unix)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_and_garbage_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let m = vec![PersistedMember {
            node: "n1".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            last_seen_unix_ms: Some(1_000),
        }];
        write_members(dir.path(), &m).unwrap();
        assert_eq!(read_members(dir.path()), m);
        fs::write(dir.path().join(MEMBERS_FILE), b"{garbage").unwrap();
        assert!(read_members(dir.path()).is_empty());
        assert!(matches!(
            read_members_checked(dir.path()),
            Err(MembersFileError::Parse(_))
        ));
    }

    #[test]
    fn a_torn_members_file_is_refused_whole_and_an_old_one_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let m: Vec<PersistedMember> = (0..10)
            .map(|i| PersistedMember {
                node: format!("n{i}"),
                addr: format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                last_seen_unix_ms: Some(5_000 + i),
            })
            .collect();
        write_members(dir.path(), &m).unwrap();
        let full = fs::read(dir.path().join(MEMBERS_FILE)).unwrap();
        // A crash mid-write (were the write not atomic) leaves a prefix: never half a list.
        for cut in [1, full.len() / 2, full.len() - 1] {
            fs::write(dir.path().join(MEMBERS_FILE), &full[..cut]).unwrap();
            assert!(read_members_checked(dir.path()).is_err(), "cut at {cut}");
        }
        // Files written before the address book (no last-seen time) still read.
        fs::write(
            dir.path().join(MEMBERS_FILE),
            br#"[{"node":"n1","addr":"127.0.0.1:1"}]"#,
        )
        .unwrap();
        let old = read_members_checked(dir.path()).unwrap();
        assert_eq!(old[0].last_seen_unix_ms, None);
        assert_eq!(old[0].to_known(9_000).unseen_for_ms, 0);
        // Last-seen round trip through the book's "unseen for".
        let k = KnownAddress {
            addr: "127.0.0.1:2".parse().unwrap(),
            node: NodeId::new("n2").ok(),
            seed: false,
            unseen_for_ms: 4_000,
        };
        let p = PersistedMember::from_known(&k, 10_000);
        assert_eq!(p.last_seen_unix_ms, Some(6_000));
        assert_eq!(p.to_known(16_000).unseen_for_ms, 10_000);
        assert_eq!(p.to_known(16_000).node, k.node);
    }
}
