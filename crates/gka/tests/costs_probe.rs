mod common;
use common::*;

#[test]
#[ignore]
fn probe() {
    for p in [conclave_gka::ProtocolId::Tgdh, conclave_gka::ProtocolId::Str] {
        for n in [4usize, 5, 8, 9, 16, 17, 32, 33, 64] {
            for (ev, script) in [
                ("join", format!("{}join x\n", init_script(n))),
                ("leave-mid", format!("{}leave m{}\n", init_script(n), n / 2)),
                ("merge3", format!("{}merge x y z\n", init_script(n))),
                ("partition3", format!("{}partition m1 m2 m{}\n", init_script(n), n - 1)),
            ] {
                let tb = run(p, &script, 9);
                let r = tb.records.iter().rev().find(|r| r.members.contains(&"m0".to_string())).unwrap();
                println!("{p:?} {ev} n={n}: n'={} rounds={} msgs={} exps_c={} sigs_c={} verifs_c={}", r.members.len(), r.rounds, r.messages, r.exps_critical, r.sigs_critical, r.verifs_critical);
            }
        }
    }
}
