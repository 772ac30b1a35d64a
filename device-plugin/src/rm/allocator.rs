//! Topology-aware choice of GPUs for a multi-GPU container.
//!
//! The kubelet asks, at admission, which `size` devices out of the available
//! ones we would prefer. We answer with the set that maximises the NVLink
//! links inside it and, among sets with equally many links, the number of
//! GPU pairs that share a NUMA node. Remaining ties go to the lowest GPU
//! indices, so the answer is deterministic.
//!
//! The search is exact. The topology is turned into a pair-score matrix once
//! (at start-up and whenever the inventory changes); a request is then a
//! branch-and-bound over GPUs in index order whose bound comes from per-GPU
//! score rows sorted in advance, so 16 GPUs take microseconds.

use std::collections::HashMap;

use super::backend::GpuInfo;

/// The most GPUs a topology can hold; the search uses 32-bit sets.
pub(crate) const MAX_GPUS: usize = 32;

/// Why a preferred allocation cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// An ID is not a GPU of this node.
    #[error("unknown device ID {0:?}")]
    UnknownDevice(String),
    /// An ID appears twice in one list.
    #[error("device ID {0:?} is listed twice")]
    DuplicateDevice(String),
    /// More must-include devices than the requested size.
    #[error("{must_include} must-include devices do not fit in an allocation of {size}")]
    MustIncludeExceedsSize {
        /// Number of must-include devices.
        must_include: usize,
        /// Requested size.
        size: usize,
    },
    /// Not enough devices to choose from.
    #[error("allocation of {size} requested but only {available} devices are available")]
    NotEnoughDevices {
        /// Requested size.
        size: usize,
        /// Available devices (including must-include ones).
        available: usize,
    },
    /// The node has more GPUs than the search supports.
    #[error("topology has {0} GPUs; at most {MAX_GPUS} are supported")]
    TooManyGpus(usize),
}

/// Scores: links dominate, same-NUMA pairs break ties. A pair's NUMA bonus is
/// 1 and a set of 32 GPUs has 496 pairs, so a link weight of 512 keeps one
/// link worth more than any number of NUMA bonuses.
const LINK_WEIGHT: u64 = 512;

/// The node's GPU topology, precomputed for fast preferred-allocation queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    ids: Vec<String>,
    index_of: HashMap<String, usize>,
    /// `links[i * n + j]`: NVLink links between GPU i and j.
    links: Vec<u32>,
    numa: Vec<Option<i64>>,
    /// `score[i * n + j]`: pair score of GPU i and j.
    score: Vec<u64>,
    /// Row i of `score` sorted descending, as prefix sums: `prefix[i * (n + 1) + k]`
    /// is the sum of i's best k pair scores.
    prefix: Vec<u64>,
}

impl Topology {
    /// Builds the matrix from the backend's GPUs (in the order given).
    pub fn new(gpus: &[GpuInfo]) -> Result<Self, AllocationError> {
        let n = gpus.len();
        if n > MAX_GPUS {
            return Err(AllocationError::TooManyGpus(n));
        }
        let ids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        let index_of: HashMap<String, usize> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), i))
            .collect();
        let numa: Vec<Option<i64>> = gpus.iter().map(|g| g.numa_node).collect();
        let mut links = vec![0u32; n * n];
        for (i, gpu) in gpus.iter().enumerate() {
            for (peer, &count) in &gpu.nvlinks {
                if let Some(&j) = index_of.get(peer)
                    && i != j
                {
                    // Take the larger claim so one-sided reports still count.
                    links[i * n + j] = links[i * n + j].max(count);
                    links[j * n + i] = links[j * n + i].max(count);
                }
            }
        }
        let mut score = vec![0u64; n * n];
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                let same_numa = matches!((numa[i], numa[j]), (Some(a), Some(b)) if a == b);
                score[i * n + j] = u64::from(links[i * n + j]) * LINK_WEIGHT + u64::from(same_numa);
            }
        }
        let mut prefix = vec![0u64; n * (n + 1)];
        for i in 0..n {
            let mut row: Vec<u64> = (0..n)
                .filter(|&j| j != i)
                .map(|j| score[i * n + j])
                .collect();
            row.sort_unstable_by(|a, b| b.cmp(a));
            for k in 0..n {
                let add = row.get(k).copied().unwrap_or(0);
                prefix[i * (n + 1) + k + 1] = prefix[i * (n + 1) + k] + add;
            }
        }
        Ok(Self {
            ids,
            index_of,
            links,
            numa,
            score,
            prefix,
        })
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the node has no GPUs.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Device IDs in topology order.
    pub(crate) fn ids(&self) -> &[String] {
        &self.ids
    }

    /// NUMA node of a GPU by topology position.
    pub(crate) fn numa(&self, i: usize) -> Option<i64> {
        self.numa[i]
    }

    /// The link matrix as rows, for `discover`.
    pub(crate) fn link_matrix(&self) -> Vec<Vec<u32>> {
        let n = self.len();
        (0..n)
            .map(|i| self.links[i * n..(i + 1) * n].to_vec())
            .collect()
    }

    /// Total NVLink links inside a set of positions.
    #[cfg(test)]
    pub(crate) fn set_links(&self, set: &[usize]) -> u64 {
        let mut total = 0;
        for (a, &i) in set.iter().enumerate() {
            for &j in &set[a + 1..] {
                total += u64::from(self.links[i * self.len() + j]);
            }
        }
        total
    }

    /// The pair score (links, then NUMA) of a set of positions.
    pub fn set_score(&self, set: &[usize]) -> u64 {
        let n = self.len();
        let mut total = 0;
        for (a, &i) in set.iter().enumerate() {
            for &j in &set[a + 1..] {
                total += self.score[i * n + j];
            }
        }
        total
    }

    fn positions(&self, ids: &[impl AsRef<str>]) -> Result<u32, AllocationError> {
        let mut mask = 0u32;
        for id in ids {
            let id = id.as_ref();
            let &i = self
                .index_of
                .get(id)
                .ok_or_else(|| AllocationError::UnknownDevice(id.to_string()))?;
            if mask & (1 << i) != 0 {
                return Err(AllocationError::DuplicateDevice(id.to_string()));
            }
            mask |= 1 << i;
        }
        Ok(mask)
    }

    /// The preferred `size` devices out of `available`, always containing `must_include`.
    ///
    /// Must-include devices need not be repeated in `available`. The result is
    /// in topology (GPU index) order.
    pub fn preferred(
        &self,
        available: &[impl AsRef<str>],
        must_include: &[impl AsRef<str>],
        size: usize,
    ) -> Result<Vec<String>, AllocationError> {
        let must = self.positions(must_include)?;
        let avail = self.positions(available)? | must;
        let must_count = must.count_ones() as usize;
        if must_count > size {
            return Err(AllocationError::MustIncludeExceedsSize {
                must_include: must_count,
                size,
            });
        }
        let available_count = avail.count_ones() as usize;
        if available_count < size {
            return Err(AllocationError::NotEnoughDevices {
                size,
                available: available_count,
            });
        }
        let chosen = if size == must_count {
            must
        } else if size == available_count {
            avail
        } else {
            self.search(avail & !must, must, size - must_count)
        };
        Ok((0..self.len())
            .filter(|&i| chosen & (1 << i) != 0)
            .map(|i| self.ids[i].clone())
            .collect())
    }

    /// Exact search for the best `need` extra positions from `candidates` to add to `must`.
    fn search(&self, candidates: u32, must: u32, need: usize) -> u32 {
        let n = self.len();
        let mut to_chosen = [0u64; MAX_GPUS];
        for (i, slot) in to_chosen.iter_mut().enumerate().take(n) {
            *slot = (0..n)
                .filter(|&j| must & (1 << j) != 0)
                .map(|j| self.score[i * n + j])
                .sum();
        }
        let cands: Vec<usize> = (0..n).filter(|&i| candidates & (1 << i) != 0).collect();
        let mut search = Search {
            topology: self,
            cands: &cands,
            best: None,
        };
        search.descend(0, must, 0, need, &mut to_chosen);
        search.best.map_or(must, |(_, set)| set)
    }
}

struct Search<'a> {
    topology: &'a Topology,
    cands: &'a [usize],
    /// Best (score, set) so far; only a strictly better set replaces it, so
    /// among equals the first in index order wins.
    best: Option<(u64, u32)>,
}

impl Search<'_> {
    /// `to_chosen[i]`: pair score of GPU i with everything chosen so far.
    fn descend(
        &mut self,
        pos: usize,
        chosen: u32,
        score: u64,
        need: usize,
        to_chosen: &mut [u64; MAX_GPUS],
    ) {
        if need == 0 {
            if self.best.is_none_or(|(best, _)| score > best) {
                self.best = Some((score, chosen));
            }
            return;
        }
        let remaining = &self.cands[pos..];
        if remaining.len() < need {
            return;
        }
        if let Some((best, _)) = self.best
            && 2 * score + self.bound(remaining, need, to_chosen) <= 2 * best
        {
            return;
        }
        let topology = self.topology;
        let n = topology.len();
        let c = remaining[0];
        for &i in remaining {
            to_chosen[i] += topology.score[i * n + c];
        }
        self.descend(
            pos + 1,
            chosen | (1 << c),
            score + to_chosen[c],
            need - 1,
            to_chosen,
        );
        for &i in remaining {
            to_chosen[i] -= topology.score[i * n + c];
        }
        self.descend(pos + 1, chosen, score, need, to_chosen);
    }

    /// Twice an upper bound on what `need` more GPUs from `remaining` can add.
    ///
    /// Each added GPU contributes its score to the chosen set plus half of its
    /// scores to the other added GPUs; the latter is at most half of its best
    /// `need - 1` pair scores overall, precomputed in `prefix`.
    fn bound(&self, remaining: &[usize], need: usize, to_chosen: &[u64; MAX_GPUS]) -> u64 {
        let topology = self.topology;
        let stride = topology.len() + 1;
        let mut values = [0u64; MAX_GPUS];
        for (slot, &i) in values.iter_mut().zip(remaining) {
            *slot = 2 * to_chosen[i] + topology.prefix[i * stride + need - 1];
        }
        let values = &mut values[..remaining.len()];
        if need < values.len() {
            values.select_nth_unstable_by(need - 1, |a, b| b.cmp(a));
        }
        values[..need].iter().sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rm::backend::ComputeCapability;

    pub(crate) fn uuid(i: usize) -> String {
        format!("GPU-{i:02}")
    }

    /// GPUs with NUMA node `numa(i)` and the given undirected links.
    pub(crate) fn gpus(
        n: usize,
        numa: impl Fn(usize) -> i64,
        links: &[(usize, usize, u32)],
    ) -> Vec<GpuInfo> {
        (0..n)
            .map(|i| GpuInfo {
                uuid: uuid(i),
                index: i as u32,
                minor_number: i as u32,
                name: "NVIDIA Test".into(),
                memory_mib: 1024,
                pci_bus_id: None,
                numa_node: Some(numa(i)),
                compute_capability: ComputeCapability { major: 8, minor: 0 },
                nvlinks: links
                    .iter()
                    .filter_map(|&(a, b, c)| match (a == i, b == i) {
                        (true, _) => Some((uuid(b), c)),
                        (_, true) => Some((uuid(a), c)),
                        _ => None,
                    })
                    .collect::<BTreeMap<_, _>>(),
            })
            .collect()
    }

    /// DGX-1 (V100) hybrid cube-mesh: two quads joined by single and double links.
    pub(crate) fn dgx1() -> Vec<GpuInfo> {
        #[rustfmt::skip]
        let links = [
            (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
            (1, 2, 2), (1, 3, 1), (1, 5, 2),
            (2, 3, 2), (2, 6, 1),
            (3, 7, 1),
            (4, 5, 1), (4, 6, 1), (4, 7, 2),
            (5, 6, 2), (5, 7, 1),
            (6, 7, 2),
        ];
        gpus(8, |i| (i / 4) as i64, &links)
    }

    /// NVSwitch all-to-all: every pair has 12 links; NUMA halves.
    pub(crate) fn nvswitch(n: usize) -> Vec<GpuInfo> {
        let mut links = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                links.push((a, b, 12));
            }
        }
        gpus(n, |i| (i / (n / 2)) as i64, &links)
    }

    /// Two sockets, PCIe only: no links at all.
    pub(crate) fn pcie_two_socket() -> Vec<GpuInfo> {
        gpus(8, |i| (i / 4) as i64, &[])
    }

    /// Best set by exhaustive enumeration; ties go to the lexicographically smallest.
    fn brute_force(t: &Topology, avail: &[usize], must: &[usize], size: usize) -> Vec<usize> {
        let mut best: Option<(u64, Vec<usize>)> = None;
        let n = t.len();
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != size {
                continue;
            }
            let set: Vec<usize> = (0..n).filter(|&i| mask & (1 << i) != 0).collect();
            if !must.iter().all(|m| set.contains(m))
                || !set.iter().all(|i| avail.contains(i) || must.contains(i))
            {
                continue;
            }
            let score = t.set_score(&set);
            let better = match &best {
                None => true,
                Some((s, b)) => score > *s || (score == *s && set < *b),
            };
            if better {
                best = Some((score, set));
            }
        }
        best.map(|(_, s)| s).unwrap_or_default()
    }

    fn ask(t: &Topology, avail: &[usize], must: &[usize], size: usize) -> Vec<usize> {
        let avail: Vec<String> = avail.iter().map(|&i| uuid(i)).collect();
        let must: Vec<String> = must.iter().map(|&i| uuid(i)).collect();
        let got = t.preferred(&avail, &must, size).unwrap();
        got.iter().map(|id| t.index_of[id]).collect()
    }

    fn assert_optimal_for_every_size(gpus: &[GpuInfo]) {
        let t = Topology::new(gpus).unwrap();
        let n = t.len();
        let all: Vec<usize> = (0..n).collect();
        for size in 1..=n {
            assert_eq!(
                ask(&t, &all, &[], size),
                brute_force(&t, &all, &[], size),
                "size {size}"
            );
            for must in [vec![n - 1], vec![1, n / 2 + 1]] {
                if must.len() <= size {
                    let got = ask(&t, &all, &must, size);
                    assert!(must.iter().all(|m| got.contains(m)));
                    assert_eq!(
                        got,
                        brute_force(&t, &all, &must, size),
                        "size {size} must {must:?}"
                    );
                }
            }
            // Some GPUs already taken by other pods.
            let avail: Vec<usize> = all.iter().copied().filter(|i| i % 3 != 1).collect();
            if size <= avail.len() {
                assert_eq!(
                    ask(&t, &avail, &[], size),
                    brute_force(&t, &avail, &[], size)
                );
            }
        }
    }

    #[test]
    fn dgx1_cube_mesh_choice_is_optimal_for_every_size() {
        assert_optimal_for_every_size(&dgx1());
    }

    #[test]
    fn nvswitch_all_to_all_choice_is_optimal_for_every_size() {
        assert_optimal_for_every_size(&nvswitch(8));
    }

    #[test]
    fn pcie_two_socket_choice_is_optimal_for_every_size() {
        assert_optimal_for_every_size(&pcie_two_socket());
    }

    #[test]
    fn sixteen_gpu_nvswitch_choice_is_optimal_for_every_size() {
        let t = Topology::new(&nvswitch(16)).unwrap();
        let all: Vec<usize> = (0..16).collect();
        for size in 1..=16 {
            assert_eq!(ask(&t, &all, &[], size), brute_force(&t, &all, &[], size));
            assert_eq!(ask(&t, &all, &[9], size), brute_force(&t, &all, &[9], size));
        }
    }

    #[test]
    fn dgx1_pair_prefers_double_link_in_same_numa_node() {
        let t = Topology::new(&dgx1()).unwrap();
        assert_eq!(ask(&t, &(0..8).collect::<Vec<_>>(), &[], 2), vec![0, 3]);
        assert_eq!(
            ask(&t, &(0..8).collect::<Vec<_>>(), &[], 4),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn pcie_only_choice_stays_on_the_must_include_socket() {
        let t = Topology::new(&pcie_two_socket()).unwrap();
        assert_eq!(ask(&t, &(0..8).collect::<Vec<_>>(), &[5], 3), vec![4, 5, 6]);
    }

    #[test]
    fn must_include_missing_from_available_is_still_included() {
        let t = Topology::new(&nvswitch(8)).unwrap();
        assert_eq!(ask(&t, &[0, 1, 2], &[7], 2), vec![0, 7]);
    }

    #[test]
    fn bad_requests_are_errors_not_panics() {
        let t = Topology::new(&nvswitch(8)).unwrap();
        let none: [&str; 0] = [];
        assert_eq!(
            t.preferred(&["GPU-99"], &none, 1),
            Err(AllocationError::UnknownDevice("GPU-99".into()))
        );
        assert_eq!(
            t.preferred(&["GPU-01", "GPU-01"], &none, 1),
            Err(AllocationError::DuplicateDevice("GPU-01".into()))
        );
        assert_eq!(
            t.preferred(&["GPU-01", "GPU-02"], &["GPU-01", "GPU-02"], 1),
            Err(AllocationError::MustIncludeExceedsSize {
                must_include: 2,
                size: 1
            })
        );
        assert_eq!(
            t.preferred(&["GPU-01"], &none, 2),
            Err(AllocationError::NotEnoughDevices {
                size: 2,
                available: 1
            })
        );
        assert_eq!(t.preferred(&["GPU-01"], &none, 0), Ok(vec![]));
    }

    #[test]
    fn topologies_over_the_limit_are_rejected() {
        assert_eq!(
            Topology::new(&nvswitch(34)),
            Err(AllocationError::TooManyGpus(34))
        );
    }

    #[test]
    fn link_matrix_is_symmetric() {
        let t = Topology::new(&dgx1()).unwrap();
        let m = t.link_matrix();
        for (i, row) in m.iter().enumerate() {
            for (j, &links) in row.iter().enumerate() {
                assert_eq!(links, m[j][i]);
            }
        }
        assert_eq!(m[0][3], 2);
        assert_eq!(t.set_links(&[0, 1, 2, 3]), 9);
    }
}
