//! Prints how long one `Rule::apply` takes for the example rule of docs/rules.md on a small JSON
//! payload, when WHERE holds and when it does not. Run with
//! `cargo run --release -p braid-rules --example eval_bench`.

use std::hint::black_box;
use std::time::Instant;

use braid_rules::{Context, Rule};

const ITERATIONS: u32 = 1_000_000;

/// Nanoseconds per `rule.apply(ctx)`, over [`ITERATIONS`] calls after a warm-up.
fn ns_per_apply(rule: &Rule, ctx: &Context<'_>) -> f64 {
    for _ in 0..ITERATIONS / 10 {
        black_box(rule.apply(black_box(ctx)));
    }
    let start = Instant::now();
    for _ in 0..ITERATIONS {
        black_box(rule.apply(black_box(ctx)));
    }
    start.elapsed().as_nanos() as f64 / f64::from(ITERATIONS)
}

fn main() {
    let sql = r#"SELECT clientid, topic, payload.temp AS temp, timestamp
                 FROM "sensors/+/temp", "$events/client_connected"
                 WHERE payload.temp > 30"#;
    let rule = Rule::compile("hot", sql).expect("the example rule compiles");
    let hot = Context {
        topic: "sensors/dev1/temp",
        clientid: "dev1",
        payload: br#"{"temp": 31.5, "hum": 40}"#,
        timestamp: 1_650_018_960_123,
        ..Context::default()
    };
    let cool = Context { payload: br#"{"temp": 21.5, "hum": 40}"#, ..hot };
    assert!(rule.apply(&hot).is_some() && rule.apply(&cool).is_none());
    println!("WHERE holds (output built): {:.0} ns per apply", ns_per_apply(&rule, &hot));
    println!("WHERE fails (no output):    {:.0} ns per apply", ns_per_apply(&rule, &cool));
}
