//! The trace both benchmarks run on: a representative MetaSchedule-style CPU schedule.

use std::collections::BTreeMap;

use _core::decision::Decision;
use _core::instruction::{Arg, Instruction, RvId};
use _core::trace::Trace;

/// Builds traces instruction by instruction, handing out fresh rv ids.
struct TraceBuilder {
    trace: Trace,
    next_rv: RvId,
}

impl TraceBuilder {
    fn new() -> Self {
        TraceBuilder {
            trace: Trace::new(),
            next_rv: 0,
        }
    }

    fn push(
        &mut self,
        kind: &str,
        inputs: Vec<Arg>,
        attrs: &[(&str, Arg)],
        num_outputs: u32,
        decision: Option<Decision>,
    ) -> Vec<Arg> {
        let outputs: Vec<RvId> = (self.next_rv..self.next_rv + num_outputs).collect();
        self.next_rv += num_outputs;
        let attrs: BTreeMap<String, Arg> = attrs
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect();
        self.trace
            .push(
                Instruction::new(kind, inputs, attrs, outputs.clone()),
                decision,
            )
            .expect("benchmark trace is valid");
        outputs.into_iter().map(Arg::Rv).collect()
    }

    /// Samples a perfect tiling of `loop_rv` and splits the loop by it.
    fn tile(&mut self, loop_rv: &Arg, factors: Vec<i64>, max_innermost: i64) -> Vec<Arg> {
        let n = factors.len() as u32;
        let attrs = [
            ("n", Arg::Int(n.into())),
            ("max_innermost_factor", Arg::Int(max_innermost)),
        ];
        let tiles = self.push(
            "sample_perfect_tile",
            vec![loop_rv.clone()],
            &attrs,
            n,
            Some(Decision::Tile(factors)),
        );
        self.push(
            "split",
            vec![loop_rv.clone(), Arg::List(tiles)],
            &[("preserve_unit_iters", Arg::Bool(true))],
            n,
            None,
        )
    }
}

/// A multi-level tiling schedule of a 512x512x512 matmul, like MetaSchedule's on CPU (40 instructions).
pub fn matmul_schedule_trace() -> Trace {
    let mut b = TraceBuilder::new();
    let block = b.push(
        "get_sblock",
        vec![],
        &[
            ("name", Arg::Str("C".into())),
            ("func_name", Arg::Str("main".into())),
        ],
        1,
        None,
    );
    b.push(
        "annotate",
        vec![block[0].clone()],
        &[
            ("key", Arg::Str("meta_schedule.tiling_structure".into())),
            ("value", Arg::Str("SSRSRS".into())),
        ],
        0,
        None,
    );
    let loops = b.push("get_loops", vec![block[0].clone()], &[], 3, None);
    let i = b.tile(&loops[0], vec![4, 2, 8, 8], 64);
    let j = b.tile(&loops[1], vec![2, 8, 2, 16], 64);
    let k = b.tile(&loops[2], vec![128, 4], 64);
    let order = vec![
        i[0].clone(),
        j[0].clone(),
        i[1].clone(),
        j[1].clone(),
        k[0].clone(),
        i[2].clone(),
        j[2].clone(),
        k[1].clone(),
        i[3].clone(),
        j[3].clone(),
    ];
    b.push("reorder", order, &[], 0, None);
    let cache = b.push(
        "cache_write",
        vec![block[0].clone()],
        &[
            ("write_buffer_index", Arg::Int(0)),
            ("storage_scope", Arg::Str("global".into())),
        ],
        1,
        None,
    );
    let location = b.push(
        "sample_compute_location",
        vec![cache[0].clone()],
        &[],
        1,
        Some(Decision::Index(3)),
    );
    b.push(
        "reverse_compute_at",
        vec![cache[0].clone(), location[0].clone()],
        &[
            ("preserve_unit_loops", Arg::Bool(true)),
            ("index", Arg::Int(-1)),
        ],
        0,
        None,
    );
    let consumer_loops = b.push("get_loops", vec![cache[0].clone()], &[], 4, None);
    let fused_consumer = b.push(
        "fuse",
        consumer_loops[2..].to_vec(),
        &[("preserve_unit_iters", Arg::Bool(true))],
        1,
        None,
    );
    let consumer_tiles = b.tile(&fused_consumer[0], vec![8, 16], 16);
    b.push("vectorize", vec![consumer_tiles[1].clone()], &[], 0, None);
    let root = b.push(
        "get_sblock",
        vec![],
        &[
            ("name", Arg::Str("root".into())),
            ("func_name", Arg::Str("main".into())),
        ],
        1,
        None,
    );
    b.push(
        "annotate",
        vec![root[0].clone()],
        &[
            ("key", Arg::Str("meta_schedule.parallel".into())),
            ("value", Arg::Int(256)),
        ],
        0,
        None,
    );
    b.push(
        "annotate",
        vec![root[0].clone()],
        &[
            ("key", Arg::Str("meta_schedule.vectorize".into())),
            ("value", Arg::Int(64)),
        ],
        0,
        None,
    );
    let unroll_candidates = Arg::List([0, 16, 64, 512].map(Arg::Int).to_vec());
    let probs = Arg::List([0.25; 4].map(Arg::Float).to_vec());
    let unroll = b.push(
        "sample_categorical",
        vec![],
        &[("candidates", unroll_candidates), ("probs", probs)],
        1,
        Some(Decision::Index(2)),
    );
    b.push(
        "annotate",
        vec![root[0].clone(), unroll[0].clone()],
        &[("key", Arg::Str("meta_schedule.unroll_explicit".into()))],
        0,
        None,
    );
    b.push("enter_postproc", vec![], &[], 0, None);
    b.push(
        "unannotate",
        vec![root[0].clone()],
        &[("key", Arg::Str("meta_schedule.parallel".into()))],
        0,
        None,
    );
    b.push(
        "unannotate",
        vec![root[0].clone()],
        &[("key", Arg::Str("meta_schedule.vectorize".into()))],
        0,
        None,
    );
    b.push(
        "unannotate",
        vec![root[0].clone()],
        &[("key", Arg::Str("meta_schedule.unroll_explicit".into()))],
        0,
        None,
    );
    let outer_loops = b.push("get_loops", vec![block[0].clone()], &[], 10, None);
    let fused_outer = b.push(
        "fuse",
        outer_loops[..2].to_vec(),
        &[("preserve_unit_iters", Arg::Bool(true))],
        1,
        None,
    );
    b.push("parallel", vec![fused_outer[0].clone()], &[], 0, None);
    let cache_loops = b.push("get_loops", vec![cache[0].clone()], &[], 4, None);
    b.push("vectorize", vec![cache_loops[3].clone()], &[], 0, None);
    b.push(
        "annotate",
        vec![outer_loops[2].clone()],
        &[
            ("key", Arg::Str("pragma_auto_unroll_max_step".into())),
            ("value", Arg::Int(64)),
        ],
        0,
        None,
    );
    b.push(
        "annotate",
        vec![outer_loops[2].clone()],
        &[
            ("key", Arg::Str("pragma_unroll_explicit".into())),
            ("value", Arg::Int(1)),
        ],
        0,
        None,
    );
    let init = b.push(
        "decompose_reduction",
        vec![block[0].clone(), outer_loops[4].clone()],
        &[],
        1,
        None,
    );
    let init_loops = b.push("get_loops", vec![init[0].clone()], &[], 6, None);
    b.push("vectorize", vec![init_loops[5].clone()], &[], 0, None);
    let update_loops = b.push("get_loops", vec![block[0].clone()], &[], 10, None);
    b.push("vectorize", vec![update_loops[9].clone()], &[], 0, None);
    b.push(
        "annotate",
        vec![update_loops[8].clone()],
        &[
            ("key", Arg::Str("software_pipeline_stage".into())),
            ("value", Arg::List(vec![Arg::Int(0), Arg::Int(1)])),
        ],
        0,
        None,
    );
    b.trace
}
