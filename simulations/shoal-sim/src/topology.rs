//! Regions, zones, nodes and their synthetic addresses.
//!
//! Nodes are numbered region-major, then zone, then agent. Node `i` of region `r` (0-based,
//! counted within the region) has address `127.<r+1>.<i/256>.<i%256>:7000`. These addresses
//! never touch a real network; they exist so node code can use `SocketAddr` as it will in the
//! agent. Address -> index is O(1) arithmetic, no map.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;

use crate::net::LinkClass;

/// The port every synthetic address uses.
pub const SIM_PORT: u16 = 7000;
/// At most this many nodes per region (two address octets).
pub const MAX_NODES_PER_REGION: u32 = 65_536;
/// At most this many regions (one address octet, 0 reserved).
pub const MAX_REGIONS: usize = 254;

/// Where one node lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Region index.
    pub region: u16,
    /// Global zone index.
    pub zone: u16,
    /// Synthetic address.
    pub addr: SocketAddr,
}

/// A region's shape, for building a [`Topology`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionShape {
    /// Region name.
    pub name: String,
    /// Zone names within the region.
    pub zones: Vec<String>,
    /// Agents (nodes) in every zone of the region.
    pub agents_per_zone: u32,
}

/// Errors building a topology. Nothing is built on error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    /// No regions, a region without zones, or a zone without agents.
    #[error("topology is empty: {0}")]
    Empty(String),
    /// Too many regions or too many nodes in a region for the address scheme.
    #[error("topology too large: {0}")]
    TooLarge(String),
}

/// The fixed set of nodes in a simulation.
#[derive(Clone, Debug)]
pub struct Topology {
    region_names: Vec<String>,
    zone_names: Vec<(u16, String)>,
    nodes: Vec<NodeInfo>,
    /// (first node index, node count) per region.
    region_ranges: Vec<(u32, u32)>,
}

impl Topology {
    /// Builds a topology from region shapes.
    pub fn new(regions: &[RegionShape]) -> Result<Self, TopologyError> {
        if regions.is_empty() {
            return Err(TopologyError::Empty("no regions".into()));
        }
        if regions.len() > MAX_REGIONS {
            return Err(TopologyError::TooLarge(format!(
                "{} regions, at most {MAX_REGIONS}",
                regions.len()
            )));
        }
        let mut topo = Topology {
            region_names: Vec::new(),
            zone_names: Vec::new(),
            nodes: Vec::new(),
            region_ranges: Vec::new(),
        };
        for (r, shape) in regions.iter().enumerate() {
            topo.push_region(r, shape)?;
        }
        Ok(topo)
    }

    fn push_region(&mut self, r: usize, shape: &RegionShape) -> Result<(), TopologyError> {
        if shape.zones.is_empty() || shape.agents_per_zone == 0 {
            return Err(TopologyError::Empty(format!(
                "region {} has no agents",
                shape.name
            )));
        }
        let count = u64::from(shape.agents_per_zone) * shape.zones.len() as u64;
        if count > u64::from(MAX_NODES_PER_REGION) {
            return Err(TopologyError::TooLarge(format!(
                "region {} has {count} nodes, at most {MAX_NODES_PER_REGION}",
                shape.name
            )));
        }
        let region = r as u16;
        let start = self.nodes.len() as u32;
        self.region_names.push(shape.name.clone());
        let mut i: u32 = 0;
        for zone_name in &shape.zones {
            let zone = self.zone_names.len() as u16;
            self.zone_names.push((region, zone_name.clone()));
            for _ in 0..shape.agents_per_zone {
                let ip = Ipv4Addr::new(127, region as u8 + 1, (i / 256) as u8, (i % 256) as u8);
                let addr = SocketAddr::new(IpAddr::V4(ip), SIM_PORT);
                self.nodes.push(NodeInfo { region, zone, addr });
                i += 1;
            }
        }
        self.region_ranges.push((start, i));
        Ok(())
    }

    /// `regions` regions named `r0..`, each with `zones` zones `z0..` of `agents_per_zone`.
    pub fn uniform(
        regions: usize,
        zones: usize,
        agents_per_zone: u32,
    ) -> Result<Self, TopologyError> {
        let shapes: Vec<RegionShape> = (0..regions)
            .map(|r| RegionShape {
                name: format!("r{r}"),
                zones: (0..zones).map(|z| format!("z{z}")).collect(),
                agents_per_zone,
            })
            .collect();
        Self::new(&shapes)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if there are no nodes (never, for a built topology).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `index`'s placement. Panics if out of range.
    pub fn node(&self, index: u32) -> &NodeInfo {
        &self.nodes[index as usize]
    }

    /// All nodes in index order.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Region names, by region index.
    pub fn region_names(&self) -> &[String] {
        &self.region_names
    }

    /// (region index, zone name) by global zone index.
    pub fn zone_names(&self) -> &[(u16, String)] {
        &self.zone_names
    }

    /// Region index by name.
    pub fn region_index(&self, name: &str) -> Option<u16> {
        self.region_names
            .iter()
            .position(|n| n == name)
            .map(|i| i as u16)
    }

    /// Global zone index by (region, zone name).
    pub fn zone_index(&self, region: u16, name: &str) -> Option<u16> {
        self.zone_names
            .iter()
            .position(|(r, n)| *r == region && n == name)
            .map(|i| i as u16)
    }

    /// Node indices of a region.
    pub fn region_nodes(&self, region: u16) -> Range<u32> {
        let (start, count) = self.region_ranges[region as usize];
        start..start + count
    }

    /// Node index of a synthetic address, `None` for anything else.
    pub fn index_of(&self, addr: SocketAddr) -> Option<u32> {
        let SocketAddr::V4(v4) = addr else {
            return None;
        };
        if v4.port() != SIM_PORT {
            return None;
        }
        let [a, r, hi, lo] = v4.ip().octets();
        if a != 127 || r == 0 {
            return None;
        }
        let &(start, count) = self.region_ranges.get(usize::from(r - 1))?;
        let i = u32::from(hi) * 256 + u32::from(lo);
        (i < count).then_some(start + i)
    }

    /// Latency class of the link a -> b.
    pub fn link_class(&self, a: u32, b: u32) -> LinkClass {
        let (na, nb) = (self.node(a), self.node(b));
        if na.zone == nb.zone {
            LinkClass::SameZone
        } else if na.region == nb.region {
            LinkClass::SameRegion
        } else {
            LinkClass::CrossRegion
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let t = Topology::uniform(3, 3, 200).unwrap();
        assert_eq!(t.len(), 1800);
        for i in 0..t.len() as u32 {
            assert_eq!(t.index_of(t.node(i).addr), Some(i));
        }
        assert_eq!(t.index_of("127.4.0.0:7000".parse().unwrap()), None);
        assert_eq!(t.index_of("127.1.2.88:7000".parse().unwrap()), None);
        assert_eq!(t.index_of("127.1.0.1:7001".parse().unwrap()), None);
        assert_eq!(t.link_class(0, 1), LinkClass::SameZone);
        assert_eq!(t.link_class(0, 200), LinkClass::SameRegion);
        assert_eq!(t.link_class(0, 600), LinkClass::CrossRegion);
        assert_eq!(t.region_nodes(1), 600..1200);
    }
}
