//! Prometheus metrics for `/metrics`, named after vLLM's (`wick:` for
//! `vllm:`, same suffixes, label names and buckets) so its dashboards map
//! over by swapping the prefix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use crate::engine::EngineStats;
use crate::models::moe::ExpertLoad;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// vLLM's buckets for time to first token, in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for inter-token latency, in seconds.
const INTER_TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's buckets for end-to-end request latency, in seconds.
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Buckets for one engine step's time, in seconds: a small model's decode
/// step on a GPU to a long prefill chunk on two cores.
const STEP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
    2.0, 3.0, 5.0, 7.5, 10.0, 20.0,
];
/// Buckets for one engine step's prompt tokens: 0 for a decode-only step.
const STEP_PREFILL_BUCKETS: &[f64] = &[
    0.0, 1.0, 8.0, 16.0, 32.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 1024.0, 2048.0,
    4096.0, 8192.0,
];

/// The finish reasons wick reports; each is rendered from the start (at 0)
/// so rate() queries see the series before the first such request.
const FINISH_REASONS: &[&str] = &["stop", "length", "abort", "error"];

/// All of wick's metrics, in a registry of their own. Every method takes
/// `&self` and only touches atomics, so one `Arc<Metrics>` is shared by the
/// scheduler thread and the handlers.
pub struct Metrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    kv_usage_legacy: Gauge,
    blocks_used: IntGauge,
    blocks_total: IntGauge,
    window_blocks_used: IntGauge,
    window_blocks_total: IntGauge,
    state_slots_used: IntGauge,
    state_slots_total: IntGauge,
    preemptions: EngineTotal,
    mask_deferrals: EngineTotal,
    prefix_queries: EngineTotal,
    prefix_hits: EngineTotal,
    spec_drafts: EngineTotal,
    spec_draft_tokens: EngineTotal,
    spec_accepted_tokens: EngineTotal,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    request_success: IntCounterVec,
    ttft: Histogram,
    queue_time: Histogram,
    inter_token: Histogram,
    time_per_output_token: Histogram,
    e2e: Histogram,
    step_time: Histogram,
    step_prefill_tokens: Histogram,
    prefill_budget: IntGauge,
    /// The engine's step count as last seen: each step is observed once.
    steps_seen: AtomicU64,
    /// vLLM's `model_name` label, put on every series once the model is
    /// known (the metrics exist, and render, while it loads).
    model_name: OnceLock<String>,
}

/// A counter that mirrors a running total kept by the engine.
struct EngineTotal {
    counter: IntCounter,
    /// The engine's total as last seen, so the counter advances by the
    /// difference.
    seen: AtomicU64,
}

impl EngineTotal {
    fn new(counter: IntCounter) -> Self {
        EngineTotal {
            counter,
            seen: AtomicU64::new(0),
        }
    }

    fn catch_up(&self, total: u64) {
        // fetch_max hands each caller a disjoint slice of the increase, so
        // the counter never double-counts or goes backwards.
        let seen = self.seen.fetch_max(total, Ordering::Relaxed);
        if total > seen {
            self.counter.inc_by(total - seen);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        // Names and help texts are constants, so a failure here is a bug.
        let add = |c: Box<dyn prometheus::core::Collector>| {
            registry.register(c).expect("metric names are unique");
        };
        let int_gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            add(Box::new(g.clone()));
            g
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help).expect("valid metric");
            add(Box::new(g.clone()));
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            add(Box::new(c.clone()));
            c
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric");
            add(Box::new(h.clone()));
            h
        };
        let request_success = IntCounterVec::new(
            Opts::new(
                "wick:request_success_total",
                "Count of finished requests, by finish reason.",
            ),
            &["finished_reason"],
        )
        .expect("valid metric");
        add(Box::new(request_success.clone()));
        for reason in FINISH_REASONS {
            request_success.with_label_values(&[*reason]);
        }
        Metrics {
            running: int_gauge(
                "wick:num_requests_running",
                "Number of requests in model execution batches.",
            ),
            waiting: int_gauge(
                "wick:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ),
            kv_usage: gauge(
                "wick:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ),
            kv_usage_legacy: gauge(
                "wick:gpu_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage. Same as wick:kv_cache_usage_perc, \
                 under vLLM's older name.",
            ),
            blocks_used: int_gauge("wick:kv_blocks_used", "KV-cache blocks in use."),
            blocks_total: int_gauge("wick:kv_blocks_capacity", "KV-cache blocks in the pool."),
            window_blocks_used: int_gauge(
                "wick:kv_window_blocks_used",
                "KV-cache blocks in use in the sliding-window layers' pool (0 without such layers).",
            ),
            window_blocks_total: int_gauge(
                "wick:kv_window_blocks_capacity",
                "KV-cache blocks in the sliding-window layers' pool (0 without such layers).",
            ),
            state_slots_used: int_gauge(
                "wick:state_slots_used",
                "Recurrent-state slots held by sequences (0 for models without such state).",
            ),
            state_slots_total: int_gauge(
                "wick:state_slots_capacity",
                "Recurrent-state slots, which cap the sequences that run at once (0 for models \
                 without such state).",
            ),
            preemptions: EngineTotal::new(counter(
                "wick:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
            )),
            mask_deferrals: EngineTotal::new(counter(
                "wick:grammar_mask_deferrals_total",
                "Decode steps constrained sequences sat out because their grammar masks \
                 would have taken more than their share of the step.",
            )),
            prefix_queries: EngineTotal::new(counter(
                "wick:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )),
            prefix_hits: EngineTotal::new(counter(
                "wick:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )),
            spec_drafts: EngineTotal::new(counter(
                "wick:spec_decode_num_drafts_total",
                "Decode rows that ran a speculative draft.",
            )),
            spec_draft_tokens: EngineTotal::new(counter(
                "wick:spec_decode_num_draft_tokens_total",
                "Tokens drafted by speculative decoding.",
            )),
            spec_accepted_tokens: EngineTotal::new(counter(
                "wick:spec_decode_num_accepted_tokens_total",
                "Drafted tokens kept (the model sampled them).",
            )),
            prompt_tokens: counter(
                "wick:prompt_tokens_total",
                "Number of prefill tokens processed.",
            ),
            generation_tokens: counter(
                "wick:generation_tokens_total",
                "Number of generation tokens processed.",
            ),
            request_success,
            ttft: histogram(
                "wick:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ),
            queue_time: histogram(
                "wick:request_queue_time_seconds",
                "Histogram of time each sequence waited in the queue before it first ran, in seconds.",
                TTFT_BUCKETS,
            ),
            inter_token: histogram(
                "wick:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                INTER_TOKEN_BUCKETS,
            ),
            time_per_output_token: histogram(
                "wick:time_per_output_token_seconds",
                "Histogram of time per output token in seconds. Same as \
                 wick:inter_token_latency_seconds, under vLLM's older name.",
                INTER_TOKEN_BUCKETS,
            ),
            e2e: histogram(
                "wick:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                E2E_BUCKETS,
            ),
            step_time: histogram(
                "wick:step_time_seconds",
                "Histogram of engine step time (scheduling, forward pass and sampling) in seconds.",
                STEP_BUCKETS,
            ),
            step_prefill_tokens: histogram(
                "wick:step_prefill_tokens",
                "Histogram of prompt (prefill) tokens per engine step; 0 for decode-only steps.",
                STEP_PREFILL_BUCKETS,
            ),
            prefill_budget: int_gauge(
                "wick:step_prefill_budget_tokens",
                "Prompt tokens the last engine step could take beside its decode rows under \
                 --max-step-slowdown and --max-num-batched-tokens.",
            ),
            steps_seen: AtomicU64::new(0),
            registry,
            model_name: OnceLock::new(),
        }
    }

    /// Labels every series with the served model's name from now on.
    /// Exports a mixture of experts' routing counts as
    /// `wick:moe_expert_tokens_total{layer, expert}`.
    pub fn set_expert_load(&self, load: Arc<ExpertLoad>) {
        let desc = Desc::new(
            "wick:moe_expert_tokens_total".into(),
            "Tokens routed to each expert of each mixture-of-experts layer.".into(),
            vec!["layer".into(), "expert".into()],
            Default::default(),
        )
        .expect("valid metric");
        // Registered once: a second model is never loaded into one server.
        let _ = self
            .registry
            .register(Box::new(ExpertTokens { load, desc }));
    }

    pub fn set_model_name(&self, name: &str) {
        let _ = self.model_name.set(name.to_string());
    }

    /// The scheduler's state after a step; its running totals are caught
    /// up to by the counters.
    pub fn set_engine_stats(&self, s: &EngineStats) {
        self.running.set(s.running as i64);
        self.waiting.set(s.waiting as i64);
        self.blocks_used.set(s.blocks_used as i64);
        self.blocks_total.set(s.blocks_total as i64);
        self.window_blocks_used.set(s.window_blocks_used as i64);
        self.window_blocks_total.set(s.window_blocks_total as i64);
        self.state_slots_used.set(s.state_slots_used as i64);
        self.state_slots_total.set(s.state_slots_total as i64);
        let usage = if s.blocks_total == 0 {
            0.0
        } else {
            s.blocks_used as f64 / s.blocks_total as f64
        };
        self.kv_usage.set(usage);
        self.kv_usage_legacy.set(usage);
        self.preemptions.catch_up(s.preemptions);
        self.mask_deferrals.catch_up(s.mask_deferrals);
        self.prefix_queries.catch_up(s.prefix_queries);
        self.prefix_hits.catch_up(s.prefix_hits);
        self.spec_drafts.catch_up(s.drafts.drafts);
        self.spec_draft_tokens.catch_up(s.drafts.drafted);
        self.spec_accepted_tokens.catch_up(s.drafts.accepted);
        // Published after every step, so the last step is each step in
        // turn; a repeat (an add or abort between steps) observes nothing.
        if self.steps_seen.fetch_max(s.steps, Ordering::Relaxed) < s.steps {
            self.step_time.observe(s.last_step.as_secs_f64());
            self.step_prefill_tokens
                .observe(s.last_step_prefill_tokens as f64);
            self.prefill_budget.set(s.prefill_budget as i64);
        }
    }

    pub fn add_prompt_tokens(&self, n: u64) {
        self.prompt_tokens.inc_by(n);
    }

    pub fn add_generation_tokens(&self, n: u64) {
        self.generation_tokens.inc_by(n);
    }

    pub fn observe_ttft(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    pub fn observe_queue_time(&self, secs: f64) {
        self.queue_time.observe(secs);
    }

    pub fn observe_inter_token(&self, secs: f64) {
        self.inter_token.observe(secs);
        self.time_per_output_token.observe(secs);
    }

    pub fn observe_e2e(&self, secs: f64) {
        self.e2e.observe(secs);
    }

    /// One finished request, counted once whatever its `n`; `reason` is
    /// stop, length, abort or error.
    pub fn request_finished(&self, reason: &str) {
        self.request_success.with_label_values(&[reason]).inc();
    }

    /// Everything in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        if let Some(name) = self.model_name.get() {
            for metric in families.iter_mut().flat_map(|f| f.mut_metric()) {
                let mut labels = metric.take_label();
                let mut pair = LabelPair::default();
                pair.set_name("model_name".into());
                pair.set_value(name.clone());
                labels.insert(0, pair);
                metric.set_label(labels);
            }
        }
        let mut buf = Vec::new();
        // Encoding gathered families into memory cannot fail: names are
        // validated at registration and a Vec never refuses a write.
        TextEncoder::new()
            .encode(&families, &mut buf)
            .expect("text encoding into memory");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

/// The expert routing counters, read when `/metrics` is gathered: a
/// model's layers times its experts (48 x 128 for Qwen3-30B-A3B) are too
/// many to mirror into counters on every step.
struct ExpertTokens {
    load: Arc<ExpertLoad>,
    desc: Desc,
}

impl Collector for ExpertTokens {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::COUNTER);
        let label = |name: &str, value: usize| {
            let mut pair = LabelPair::default();
            pair.set_name(name.into());
            pair.set_value(value.to_string());
            pair
        };
        let counts = self.load.snapshot();
        for layer in 0..self.load.layers() {
            for expert in 0..self.load.experts() {
                let mut counter = proto::Counter::default();
                counter.set_value(counts[layer * self.load.experts() + expert] as f64);
                let mut metric = proto::Metric::default();
                metric.set_label(vec![label("layer", layer), label("expert", expert)]);
                metric.set_counter(counter);
                family.mut_metric().push(metric);
            }
        }
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::speculation::DraftTally;

    /// The value of the sample line that starts with `series ` exactly.
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
            .parse()
            .unwrap()
    }

    fn has_type(text: &str, name: &str, kind: &str) -> bool {
        text.lines().any(|l| l == format!("# TYPE {name} {kind}"))
    }

    /// A mixture of experts' routing counts, per layer and expert, read
    /// from the model's counters whenever /metrics renders.
    #[test]
    fn renders_expert_routing_counts() {
        let m = Metrics::new();
        assert!(!m.render().contains("moe_expert_tokens"));
        let load = Arc::new(ExpertLoad::new(2, 3));
        m.set_expert_load(load.clone());
        load.record(1, 2, 5);
        load.record(1, 2, 1);
        let text = m.render();
        assert!(
            has_type(&text, "wick:moe_expert_tokens_total", "counter"),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "wick:moe_expert_tokens_total{layer=\"1\",expert=\"2\"}"
            ),
            6.0
        );
        assert_eq!(
            sample(
                &text,
                "wick:moe_expert_tokens_total{layer=\"0\",expert=\"0\"}"
            ),
            0.0
        );
        load.record(0, 0, 4);
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "wick:moe_expert_tokens_total{layer=\"0\",expert=\"0\"}"
            ),
            4.0
        );
    }

    #[test]
    fn renders_every_metric_with_its_type() {
        let text = Metrics::new().render();
        for (name, kind) in [
            ("wick:num_requests_running", "gauge"),
            ("wick:num_requests_waiting", "gauge"),
            ("wick:kv_cache_usage_perc", "gauge"),
            ("wick:gpu_cache_usage_perc", "gauge"),
            ("wick:kv_blocks_used", "gauge"),
            ("wick:kv_blocks_capacity", "gauge"),
            ("wick:kv_window_blocks_used", "gauge"),
            ("wick:kv_window_blocks_capacity", "gauge"),
            ("wick:state_slots_used", "gauge"),
            ("wick:state_slots_capacity", "gauge"),
            ("wick:num_preemptions_total", "counter"),
            ("wick:grammar_mask_deferrals_total", "counter"),
            ("wick:prefix_cache_queries_total", "counter"),
            ("wick:prefix_cache_hits_total", "counter"),
            ("wick:spec_decode_num_drafts_total", "counter"),
            ("wick:spec_decode_num_draft_tokens_total", "counter"),
            ("wick:spec_decode_num_accepted_tokens_total", "counter"),
            ("wick:prompt_tokens_total", "counter"),
            ("wick:generation_tokens_total", "counter"),
            ("wick:request_success_total", "counter"),
            ("wick:time_to_first_token_seconds", "histogram"),
            ("wick:request_queue_time_seconds", "histogram"),
            ("wick:inter_token_latency_seconds", "histogram"),
            ("wick:time_per_output_token_seconds", "histogram"),
            ("wick:e2e_request_latency_seconds", "histogram"),
            ("wick:step_time_seconds", "histogram"),
            ("wick:step_prefill_tokens", "histogram"),
            ("wick:step_prefill_budget_tokens", "gauge"),
        ] {
            assert!(has_type(&text, name, kind), "{name} {kind} in:\n{text}");
        }
        for reason in FINISH_REASONS {
            let series = format!("wick:request_success_total{{finished_reason=\"{reason}\"}}");
            assert_eq!(sample(&text, &series), 0.0);
        }
    }

    /// promtool's type-versus-suffix rules: only counters end in `_total`,
    /// and counters always do.
    #[test]
    fn names_follow_prometheus_suffix_rules() {
        let text = Metrics::new().render();
        let mut checked = 0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(
                name.ends_with("_total"),
                kind == "counter",
                "{name} is a {kind}"
            );
            for reserved in ["_count", "_sum", "_bucket"] {
                assert!(!name.ends_with(reserved), "{name}");
            }
            checked += 1;
        }
        assert_eq!(checked, 28);
    }

    #[test]
    fn renders_recorded_values() {
        let m = Metrics::new();
        m.set_engine_stats(&EngineStats {
            running: 3,
            waiting: 5,
            queued: 0,
            blocks_used: 30,
            blocks_total: 120,
            window_blocks_used: 7,
            window_blocks_total: 40,
            state_slots_used: 2,
            state_slots_total: 6,
            preemptions: 2,
            mask_deferrals: 4,
            prefix_queries: 900,
            prefix_hits: 640,
            steps: 1,
            last_step: std::time::Duration::from_millis(600),
            last_step_prefill_tokens: 56,
            prefill_budget: 56,
            drafts: DraftTally {
                drafts: 3,
                drafted: 12,
                accepted: 9,
            },
        });
        m.add_prompt_tokens(100);
        m.add_prompt_tokens(28);
        m.add_generation_tokens(7);
        m.request_finished("stop");
        m.request_finished("stop");
        m.request_finished("length");
        m.observe_ttft(0.03);
        m.observe_inter_token(0.02);
        m.observe_inter_token(0.2);
        m.observe_e2e(1.2);
        let text = m.render();
        let v = |series: &str| sample(&text, series);
        assert_eq!(v("wick:num_requests_running"), 3.0);
        assert_eq!(v("wick:num_requests_waiting"), 5.0);
        assert_eq!(v("wick:kv_blocks_used"), 30.0);
        assert_eq!(v("wick:kv_blocks_capacity"), 120.0);
        assert_eq!(v("wick:kv_window_blocks_used"), 7.0);
        assert_eq!(v("wick:kv_window_blocks_capacity"), 40.0);
        assert_eq!(v("wick:state_slots_used"), 2.0);
        assert_eq!(v("wick:state_slots_capacity"), 6.0);
        assert_eq!(v("wick:kv_cache_usage_perc"), 0.25);
        assert_eq!(v("wick:gpu_cache_usage_perc"), 0.25);
        assert_eq!(v("wick:num_preemptions_total"), 2.0);
        assert_eq!(v("wick:grammar_mask_deferrals_total"), 4.0);
        assert_eq!(v("wick:prefix_cache_queries_total"), 900.0);
        assert_eq!(v("wick:prefix_cache_hits_total"), 640.0);
        assert_eq!(v("wick:spec_decode_num_drafts_total"), 3.0);
        assert_eq!(v("wick:spec_decode_num_draft_tokens_total"), 12.0);
        assert_eq!(v("wick:spec_decode_num_accepted_tokens_total"), 9.0);
        assert_eq!(v("wick:prompt_tokens_total"), 128.0);
        assert_eq!(v("wick:generation_tokens_total"), 7.0);
        assert_eq!(
            v("wick:request_success_total{finished_reason=\"stop\"}"),
            2.0
        );
        assert_eq!(
            v("wick:request_success_total{finished_reason=\"length\"}"),
            1.0
        );
        assert_eq!(
            v("wick:request_success_total{finished_reason=\"abort\"}"),
            0.0
        );

        assert_eq!(v("wick:time_to_first_token_seconds_count"), 1.0);
        assert_eq!(v("wick:time_to_first_token_seconds_sum"), 0.03);
        assert_eq!(
            v("wick:time_to_first_token_seconds_bucket{le=\"0.02\"}"),
            0.0
        );
        assert_eq!(
            v("wick:time_to_first_token_seconds_bucket{le=\"0.04\"}"),
            1.0
        );
        assert_eq!(
            v("wick:time_to_first_token_seconds_bucket{le=\"2560\"}"),
            1.0
        );
        for name in [
            "wick:inter_token_latency_seconds",
            "wick:time_per_output_token_seconds",
        ] {
            assert_eq!(v(&format!("{name}_count")), 2.0);
            assert_eq!(v(&format!("{name}_bucket{{le=\"0.025\"}}")), 1.0);
            assert_eq!(v(&format!("{name}_bucket{{le=\"0.2\"}}")), 2.0);
            assert_eq!(v(&format!("{name}_bucket{{le=\"+Inf\"}}")), 2.0);
        }
        assert_eq!(v("wick:step_time_seconds_count"), 1.0);
        assert_eq!(v("wick:step_time_seconds_bucket{le=\"0.5\"}"), 0.0);
        assert_eq!(v("wick:step_time_seconds_bucket{le=\"0.75\"}"), 1.0);
        assert_eq!(v("wick:step_prefill_tokens_bucket{le=\"32\"}"), 0.0);
        assert_eq!(v("wick:step_prefill_tokens_bucket{le=\"64\"}"), 1.0);
        assert_eq!(v("wick:step_prefill_budget_tokens"), 56.0);
        assert_eq!(v("wick:e2e_request_latency_seconds_count"), 1.0);
        assert_eq!(v("wick:e2e_request_latency_seconds_bucket{le=\"1\"}"), 0.0);
        assert_eq!(
            v("wick:e2e_request_latency_seconds_bucket{le=\"1.5\"}"),
            1.0
        );
    }

    #[test]
    fn every_series_carries_the_model_name_once_known() {
        let m = Metrics::new();
        m.request_finished("stop");
        assert!(!m.render().contains("model_name"));
        m.set_model_name("smol");
        let text = m.render();
        assert_eq!(
            sample(&text, "wick:num_requests_running{model_name=\"smol\"}"),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                "wick:request_success_total{model_name=\"smol\",finished_reason=\"stop\"}"
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                "wick:time_to_first_token_seconds_bucket{model_name=\"smol\",le=\"0.001\"}"
            ),
            0.0
        );
        let samples = text.lines().filter(|l| !l.starts_with('#'));
        for line in samples {
            assert!(line.contains("{model_name=\"smol\""), "unlabelled: {line}");
        }
    }

    #[test]
    fn counters_follow_the_engine_totals() {
        let m = Metrics::new();
        let total = |m: &Metrics, name: &str| sample(&m.render(), name);
        let at = |n: u64| EngineStats {
            preemptions: n,
            prefix_hits: 2 * n,
            ..Default::default()
        };
        m.set_engine_stats(&at(3));
        assert_eq!(total(&m, "wick:num_preemptions_total"), 3.0);
        m.set_engine_stats(&at(3));
        assert_eq!(
            total(&m, "wick:num_preemptions_total"),
            3.0,
            "an unchanged total adds nothing"
        );
        m.set_engine_stats(&at(10));
        assert_eq!(total(&m, "wick:num_preemptions_total"), 10.0);
        // A stale (smaller) total must not move a counter backwards.
        m.set_engine_stats(&at(4));
        assert_eq!(total(&m, "wick:num_preemptions_total"), 10.0);
        assert_eq!(total(&m, "wick:prefix_cache_hits_total"), 20.0);
        // Empty pool: usage is 0, not NaN.
        assert_eq!(sample(&m.render(), "wick:kv_cache_usage_perc"), 0.0);
    }

    #[test]
    fn each_step_is_observed_once() {
        let m = Metrics::new();
        let step = |n: u64, prefill: usize| EngineStats {
            steps: n,
            last_step: std::time::Duration::from_millis(100),
            last_step_prefill_tokens: prefill,
            prefill_budget: 64,
            ..Default::default()
        };
        m.set_engine_stats(&step(0, 0));
        let v = |m: &Metrics, series: &str| sample(&m.render(), series);
        assert_eq!(v(&m, "wick:step_time_seconds_count"), 0.0, "no step yet");
        m.set_engine_stats(&step(1, 0));
        m.set_engine_stats(&step(1, 0));
        m.set_engine_stats(&step(2, 40));
        assert_eq!(v(&m, "wick:step_time_seconds_count"), 2.0);
        assert_eq!(v(&m, "wick:step_prefill_tokens_sum"), 40.0);
        assert_eq!(v(&m, "wick:step_prefill_tokens_bucket{le=\"0\"}"), 1.0);
        assert_eq!(v(&m, "wick:step_prefill_budget_tokens"), 64.0);
    }

    #[test]
    fn shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
        let m = std::sync::Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.add_generation_tokens(1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(sample(&m.render(), "wick:generation_tokens_total"), 4000.0);
    }
}
