//! The registration table behind the bootstrap server: what a
//! registration would change, applying it, and the `/query` snapshot.
use std::collections::BTreeMap;
use std::sync::Mutex;

use super::validate::{bad, conflict, Refusal};
use super::{DpEntry, ExpectedTopology, QueryTable, RegisterRequest, MAX_DP_RANKS, MAX_WORKERS};

/// tp rank → pp rank → side-channel address.
type Workers = BTreeMap<u32, BTreeMap<u32, String>>;

#[derive(Default)]
pub(super) struct Table {
    // dp rank -> (engine id, workers)
    entries: BTreeMap<u32, (String, Workers)>,
    // dp rank -> announced (tp_size, pp_size)
    sizes: BTreeMap<u32, (Option<u32>, Option<u32>)>,
    dp_size: Option<u32>,
    workers: usize,
}

pub(super) struct ServerState {
    pub(super) table: Mutex<Table>,
    pub(super) expected: Option<ExpectedTopology>,
    pub(super) token: Option<String>,
}

/// What a registration would do to the table.
pub(super) enum Outcome {
    New,
    Same,
    /// The slot holds another address: allowed only if that worker is gone.
    Replace(String),
}

impl ServerState {
    /// What registering `r` would do, or why it is refused.
    pub(super) fn check(&self, r: &RegisterRequest) -> Result<Outcome, Refusal> {
        let t = self.table.lock().unwrap();
        if let (Some(a), Some(b)) = (r.dp_size, t.dp_size) {
            if a != b {
                return Err(conflict(format!(
                    "dp_size={a}, but dp_size={b} was announced"
                )));
            }
        }
        if let Some(n) = t.dp_size.or(self.expected.map(|e| e.dp_size)) {
            if r.dp_rank >= n {
                return Err(bad(format!("dp_rank={} is outside [0, {n})", r.dp_rank)));
            }
        }
        let Some((engine_id, workers)) = t.entries.get(&r.dp_rank) else {
            if t.entries.len() >= MAX_DP_RANKS || t.workers >= MAX_WORKERS {
                return Err(bad("the bootstrap table is full"));
            }
            return Ok(Outcome::New);
        };
        if *engine_id != r.engine_id {
            return Err(bad(format!(
                "dp_rank {} is already registered by engine_id {engine_id}, not {}",
                r.dp_rank, r.engine_id
            )));
        }
        let (tp_size, pp_size) = t.sizes.get(&r.dp_rank).copied().unwrap_or_default();
        for (what, mine, theirs, rank) in [
            ("tp", tp_size, r.tp_size, r.tp_rank),
            ("pp", pp_size, r.pp_size, r.pp_rank),
        ] {
            if let Some(n) = mine {
                if theirs.is_some_and(|m| m != n) || rank >= n {
                    return Err(conflict(format!(
                        "engine_id {} dp_rank {} registered {what}_size={n}; got {what}_size={} {what}_rank={rank}",
                        r.engine_id,
                        r.dp_rank,
                        theirs.map_or("unset".to_string(), |m| m.to_string())
                    )));
                }
            }
        }
        match workers.get(&r.tp_rank).and_then(|p| p.get(&r.pp_rank)) {
            Some(existing) if *existing == r.addr => Ok(Outcome::Same),
            Some(existing) => Ok(Outcome::Replace(existing.clone())),
            None if t.workers >= MAX_WORKERS => Err(bad("the bootstrap table is full")),
            None => Ok(Outcome::New),
        }
    }

    /// Records `r`; `replacing` is the address it may replace.
    pub(super) fn commit(
        &self,
        r: &RegisterRequest,
        replacing: Option<&str>,
    ) -> Result<(), Refusal> {
        let mut t = self.table.lock().unwrap();
        let t = &mut *t;
        if let Some(n) = r.dp_size {
            t.dp_size.get_or_insert(n);
        }
        let entry = t
            .entries
            .entry(r.dp_rank)
            .or_insert_with(|| (r.engine_id.clone(), BTreeMap::new()));
        if entry.0 != r.engine_id {
            return Err(bad(format!(
                "dp_rank {} is already registered by engine_id {}, not {}",
                r.dp_rank, entry.0, r.engine_id
            )));
        }
        let sizes = t.sizes.entry(r.dp_rank).or_default();
        if sizes.0.is_none() {
            sizes.0 = r.tp_size;
        }
        if sizes.1.is_none() {
            sizes.1 = r.pp_size;
        }
        let slot = entry.1.entry(r.tp_rank).or_default();
        match (slot.get(&r.pp_rank), replacing) {
            (None, _) => t.workers += 1,
            (Some(cur), Some(old)) if cur == old => {}
            (Some(cur), _) if *cur == r.addr => return Ok(()),
            (Some(cur), _) => {
                return Err(conflict(format!(
                "dp_rank {} tp_rank {} pp_rank {} is already registered with addr {cur}, not {}",
                r.dp_rank, r.tp_rank, r.pp_rank, r.addr
            )))
            }
        }
        slot.insert(r.pp_rank, r.addr.clone());
        Ok(())
    }

    pub(super) fn missing(&self) -> Option<String> {
        let e = self.expected?;
        let t = self.table.lock().unwrap();
        for dp in 0..e.dp_size {
            let Some((_, tps)) = t.entries.get(&dp) else {
                return Some(format!("dp_rank {dp} has not registered"));
            };
            for tp in 0..e.tp_size {
                for pp in 0..e.pp_size {
                    if !tps.get(&tp).is_some_and(|p| p.contains_key(&pp)) {
                        return Some(format!(
                            "dp_rank {dp} tp_rank {tp} pp_rank {pp} has not registered"
                        ));
                    }
                }
            }
        }
        None
    }

    pub(super) fn snapshot(&self) -> QueryTable {
        let t = self.table.lock().unwrap();
        t.entries
            .iter()
            .map(|(dp, (engine_id, tps))| {
                let worker_addr = tps
                    .iter()
                    .map(|(tp, pps)| {
                        (
                            tp.to_string(),
                            pps.iter()
                                .map(|(pp, a)| (pp.to_string(), a.clone()))
                                .collect(),
                        )
                    })
                    .collect();
                (
                    dp.to_string(),
                    DpEntry {
                        engine_id: engine_id.clone(),
                        worker_addr,
                    },
                )
            })
            .collect()
    }
}
