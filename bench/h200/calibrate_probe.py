import tempfile, json
from vramscope.integrations.qlora import write_random_checkpoint
from vramscope.planner.calibrate import calibrate, measure, estimate, resolve_model, _static
from vramscope.recipe import QLoraSpec
config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "max_position_embeddings": 4096}
_, shape = resolve_model(config)
for fw in ["trl", "hf"]:
    spec = QLoraSpec(framework=fw)
    hw, report = calibrate(config, spec)
    print(fw, report, hw.dynamic_scale, hw.dynamic_offset_bytes, hw.static_offset_bytes, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        write_random_checkpoint(config, tmp, device="cuda")
        shapes = [(1,128),(2,128),(2,256),(1,1024),(2,1024),(4,1024),(8,1024)]
        static, rows = measure(tmp, spec, 8000, shapes)
    print(fw, "static", static)
    for (b,s,alloc,res,proc) in rows:
        est = estimate(shape, spec, b, s)
        print(f"{fw} {b}x{s} measured {alloc/2**20:.1f} MiB planned {est.peak_allocated_bytes/2**20:.1f} dyn {(est.peak_allocated_bytes-_static(est.breakdown))/2**20:.1f} meas_dyn {(alloc-static)/2**20:.1f}", flush=True)
