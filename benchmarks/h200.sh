#!/usr/bin/env bash
# The H200 runs, one command per purpose (each fits the device tool's 600 s limit). Run from the repo
# root with the wheels of .whl/ carried along (see benchmarks/README.md); results go under $OUT.
#
#   bash benchmarks/h200.sh kernels   # focused verify bench (both paths vs SGLang), GPU kernel tests, phase profile
#   bash benchmarks/h200.sh engine    # AOT plugin check, calibrated engine build, generate from it, the engine tests
#   bash benchmarks/h200.sh small-engine # an engine of <= 16-node trees (blocked verify, no inverse): build, greedy == plain (fp32)
#   bash benchmarks/h200.sh commit-paths # every commit config by accepted path length (1-9 nodes): which to default to
#   bash benchmarks/h200.sh aot       # AOT plugin check, then the plugins (verify: blocked and explicit-inverse pair; conv; commit) vs the runtime's
#   bash benchmarks/h200.sh serving   # throughput (4 modes x batch, fp32 exactness), where a step's time goes
#   bash benchmarks/h200.sh repeats   # throughput at batch 8, 16, 32, four interleaved runs each (median, spread)
#   bash benchmarks/h200.sh acceptance # MAT by tree shape on the GPU (fp32; matches the CPU's)
#   bash benchmarks/h200.sh realdims  # 9B/27B dims: step latency, GDN verify share, budget sweep (the 32-prompt MAT curve)
#   bash benchmarks/h200.sh train     # re-train the embedded model with its seed; compare with the committed log
#   bash benchmarks/h200.sh configs   # every verify config at the embedded model's and 9B's heads, fp32 and bf16
#   bash benchmarks/h200.sh ratios    # the launcher's default vs SGLang, B = 1 and 16, five fresh-input rounds
#   bash benchmarks/h200.sh ncu       # Nsight Compute on the verify's two kernels at batch 16 (what limits them)
#   bash benchmarks/h200.sh probe     # what the value-tile kernel waits for: its inputs' traffic, its stores, its on-chip work (+ ncu)
#   bash benchmarks/h200.sh transposed # the value-tile kernel transposed (register A operands) beside the kept one (EXPERIMENTS.md)
#   bash benchmarks/h200.sh split     # the value tile's state products in a kernel beside the factor kernel (probe_split_products.py)
#   bash benchmarks/h200.sh edits     # the verify's kernels with one source edit each beside the kept ones (probe_source_edits.py)
#   bash benchmarks/h200.sh attention # tree attention: the Triton kernel vs the torch path at 9B/27B heads, and its A/B end to end
#   bash benchmarks/h200.sh depth     # compact vs dense factor kernel by tree depth (COMPACT_MAX_DEPTH)
#   bash benchmarks/h200.sh ops       # the bole::* operators on CUDA (opcheck, compile, GPU tests), their dispatch cost, its A/B
#   bash benchmarks/h200.sh tests     # the GPU-marked tests (~7.5 min on a fresh machine)
#   bash benchmarks/h200.sh cuda-tests # the tests that take CUDA where there is one (~2.5 min)
#   bash benchmarks/h200.sh second-gpu # on two GPUs (nvidia-h200-x2): the product on cuda:1 (its tests, bench.py, generate)
#   bash benchmarks/h200.sh steps     # the step graphs' A/B (selection, greedy verify+accept+commit), then the step profile
#   bash benchmarks/h200.sh prefill   # a GDN layer's prefill: one launch vs rounds of verify + commit (bench_prefill.py)
#   bash benchmarks/h200.sh long      # long prompts: the whole prefill's memory and time, the executor's bounded prefill
#   bash benchmarks/h200.sh prefill-tests # the GPU tests of the prefill's path, then its operators on CUDA (~2 min)
#   bash benchmarks/h200.sh gdn-inputs # the GDN layer's fused q/k norms + gates and gated output norm: their tests, then their A/B
#   bash benchmarks/h200.sh prefill-graphs # the prefill's GPU tests, then the A/B of its CUDA graphs with requests arriving
#   bash benchmarks/h200.sh accept    # sampled acceptance at a real vocabulary: read where the walk reads vs every row processed (memory, time); the bonus's inverse CDF
#   bash benchmarks/h200.sh floor     # top-k / top-p floors by radix select: CUDA tests, then against the sort at 151,936 tokens (+ block sweep)
#   bash benchmarks/h200.sh sampled   # the spec GPU tests, the sampled A/Bs (CHANGES="sampled-acceptance unfiltered-sampling"), the sampled step profile
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
# Results are named by the GPU that measured them (_bench_util.device_tag: h200, else the GPU's name).
DEV=$(cd benchmarks && python -c 'import _bench_util as U, torch; print(U.device_tag(torch.cuda.get_device_name()))')
# Each step says its exit code; the target exits 1 if any step failed (a benchmark whose check failed).
RC=0
note() { local rc=$?; echo "$1 rc=$rc"; [ "$rc" -eq 0 ] || RC=1; }
mkdir -p "$OUT"
case "${1:-}" in
kernels)
    python benchmarks/bench_gdn_verify.py --focus headline --budget-s "${BUDGET_S:-330}" --out "$OUT" \
        > "$OUT/log.txt" 2>&1; note "bench"
    python -m pytest -q -m gpu tests/kernels tests/test_transfer.py -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
    note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    python benchmarks/profile_verify.py --out "$OUT" > "$OUT/profile_log.txt" 2>&1; note "profile"
    ;;
engine)
    mkdir -p "$OUT/plugins" "$OUT/engine"
    python plugins/check_aot.py --out "$OUT/plugins" > "$OUT/plugins/check_aot.log" 2>&1; note "check_aot"
    python build_scripts/build_engine.py --calibrate --max-batch-size 32 --max-seq-len 4096 \
        --output /tmp/engine-h200 --quiet > "$OUT/engine/build.log" 2>&1; note "build"
    cp /tmp/engine-h200/config.json /tmp/engine-h200/budget.json "$OUT/engine/"
    python -m trtllm_bole generate --model /tmp/engine-h200 --device cuda --max-tokens 48 \
        > "$OUT/engine/generate.txt" 2>&1; note "generate"
    # The engine's tests where the kernels compile for this GPU, and the calibration's GPU test.
    python -m pytest -q tests/engine tests/spec/test_calibration.py tests/spec/test_budget.py -p no:cacheprovider \
        > "$OUT/engine/pytest.txt" 2>&1; note "engine tests"; tail -3 "$OUT/engine/pytest.txt"
    ;;
small-engine)
    # Trees of 16 nodes or fewer take the blocked verify, whose config has no inverse launch (a GPU
    # build of such an engine stopped on it before e38db4f's fix). Greedy from it must equal plain decoding.
    mkdir -p "$OUT/small_engine"
    python build_scripts/build_engine.py --max-draft-depth 4 --max-draft-nodes 12 --dtype float32 \
        --output /tmp/engine-small --quiet > "$OUT/small_engine/build.log" 2>&1; note "build"
    cp /tmp/engine-small/config.json "$OUT/small_engine/"
    for mode in bole ar; do
        python -m trtllm_bole generate --model /tmp/engine-small --device cuda --dtype float32 --mode "$mode" --max-tokens 64 \
            > "$OUT/small_engine/generate_$mode.txt" 2> "$OUT/small_engine/generate_$mode.err"; note "generate $mode"
    done
    diff "$OUT/small_engine/generate_bole.txt" "$OUT/small_engine/generate_ar.txt"  # the texts (stats: stderr)
    note "bole == ar"; tr '\r' '\n' < "$OUT/small_engine/generate_bole.err" | grep '^\[bole\]'
    ;;
commit-paths)
    python benchmarks/probe_commit_paths.py --out "$OUT" > "$OUT/commit_paths.log" 2>&1; note "probe"
    tail -10 "$OUT/commit_paths.log"
    ;;
aot)
    mkdir -p "$OUT/plugins"
    python plugins/check_aot.py --out "$OUT/plugins" > "$OUT/plugins/check_aot.log" 2>&1; note "check_aot"
    tail -4 "$OUT/plugins/check_aot.log"
    python benchmarks/bench_aot_plugins.py --out "$OUT" > "$OUT/aot_plugins.log" 2>&1; note "bench"
    grep -v "verify:" "$OUT/aot_plugins.log" | tail -12
    ;;
serving)
    # Greedy exactness against plain decoding is checked in float32: in bf16 the tree forward and the
    # one-token forward round differently and near-ties flip (measured: bench_throughput_h200_bf16.json).
    # 32 requests so that batch 32 is a full batch; 48 tokens each keeps the six batch sizes in one call.
    python benchmarks/prepare_dataset.py --out /tmp/code.jsonl code --num-requests 32 --output-tokens 48
    note "dataset"
    timeout 420 python benchmarks/bench.py throughput --dataset /tmp/code.jsonl --device cuda --dtype float32 \
        --batch-sizes 1,2,4,8,16,32 --out "$OUT" > "$OUT/log.txt" 2>&1; note "throughput"
    timeout 100 python benchmarks/profile_step.py --dataset /tmp/code.jsonl --device cuda --dtype float32 \
        --modes ar,tree-serial,bole --batch-sizes 8,32 --out "$OUT" >> "$OUT/log.txt" 2>&1; note "profile"
    ;;
repeats)
    # The batch >= 8 runs last seconds each and vary by tens of percent from run to run: four of each,
    # the modes interleaved, the median kept and every run's tokens/s recorded (a round in which a mode
    # captured graphs, usually the first, is left out for all: bench.py's docstring); 96 tokens per request
    # so that decoding, not the prompts' prefill, is most of a run.
    python benchmarks/prepare_dataset.py --out /tmp/code.jsonl code --num-requests 32 --output-tokens 96
    note "dataset"
    timeout 480 python benchmarks/bench.py throughput --dataset /tmp/code.jsonl --device cuda --dtype float32 \
        --batch-sizes 8,16,32 --repeats 4 --tag repeats --out "$OUT" \
        > "$OUT/log.txt" 2>&1; note "throughput"; grep "tok/s" "$OUT/log.txt" | sed 's/.*\r//' | tail -12
    ;;
acceptance)
    timeout 120 python benchmarks/eval_acceptance.py --device cuda --dtype float32 --prompts 6 --max-tokens 64 \
        --curve 4,16,64 --out "$OUT" >> "$OUT/log.txt" 2>&1; note "acceptance"
    ;;
realdims)
    timeout 560 python benchmarks/bench_real_dims.py --out "$OUT" --models qwen3.5-9b,qwen3.5-27b \
        --batches 1,8,16 --time-budget "${BUDGET_S:-200}" --acceptance benchmarks/results/acceptance_cpu.json \
        > "$OUT/log.txt" 2>&1; note "real dims"; tail -5 "$OUT/log.txt"
    ;;
train)
    # The committed run stopped at step 1497 on its time limit; --stop-after replays it on any machine speed.
    timeout 570 python build_scripts/train_tiny.py --out /tmp/retrained --corpus .data/corpus --device cuda \
        --steps 4000 --stop-after 1497 --time-limit 520 > "$OUT/train_log.txt" 2>&1; note "train"
    python build_scripts/compare_training.py trtllm_bole/assets/qwen35-code-tiny/training.json \
        /tmp/retrained/training.json --out "$OUT/train_repro_${DEV}.json"; note "compare"
    ;;
configs)
    timeout 580 python benchmarks/sweep_verify_configs.py --out "$OUT" > "$OUT/log.txt" 2>&1; note "sweep"
    ;;
depth)
    timeout 280 python benchmarks/factor_depth.py --out "$OUT" > "$OUT/log.txt" 2>&1; note "depth"
    tail -9 "$OUT/log.txt"
    ;;
ops)
    python -m pytest -q -m gpu tests/kernels tests/test_transfer.py tests/spec tests/models tests/test_tree.py \
        -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    python -m pytest -q tests/ops -p no:cacheprovider \
        > "$OUT/pytest_ops.txt" 2>&1; note "ops tests"; tail -3 "$OUT/pytest_ops.txt"
    python benchmarks/op_dispatch.py --out "$OUT" > "$OUT/dispatch_log.txt" 2>&1; note "dispatch"
    timeout 240 python benchmarks/ab_executor.py dispatcher --trials 6 --batches 1,8,32 --out "$OUT" \
        >> "$OUT/dispatch_log.txt" 2>&1; note "ab"; grep -v "loading\|warm" "$OUT/dispatch_log.txt"
    ;;
tests)
    python -m pytest -q -m gpu tests -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
    note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    ;;
cuda-tests)
    # Apart from `tests`: the two took 590 s of the device tool's 600 in one call on a fresh machine.
    # Not GPU-marked, but on CUDA where there is one: the attention, prefill, KV, forest and norm kernels
    # against their references, the cache, the operators and the LLM API.
    python -m pytest -q tests/kernels/test_tree_attention.py tests/kernels/test_gdn_prefill.py \
        tests/kernels/test_kv_commit.py tests/kernels/test_forest.py tests/kernels/test_norms.py \
        tests/models/test_cache.py tests/ops tests/test_llm.py -p no:cacheprovider \
        > "$OUT/pytest_cuda.txt" 2>&1; note "cuda tests"; tail -3 "$OUT/pytest_cuda.txt"
    ;;
second-gpu)
    # Triton, CUDA streams, events and graph captures take the thread's current GPU, not their tensors'.
    python -m pytest -q -rs tests/test_devices.py -p no:cacheprovider > "$OUT/pytest_devices.txt" 2>&1
    note "device tests"; tail -3 "$OUT/pytest_devices.txt"
    python benchmarks/prepare_dataset.py --out /tmp/code.jsonl code --num-requests 4 --output-tokens 32
    note "dataset"
    timeout 240 python benchmarks/bench.py throughput --dataset /tmp/code.jsonl --device cuda:1 --dtype float32 \
        --modes bole --batch-sizes 1,4 --out "$OUT" --tag second_gpu > "$OUT/bench_log.txt" 2>&1
    note "bench"; tail -4 "$OUT/bench_log.txt"
    python -m trtllm_bole generate --device cuda:1 --max-tokens 32 > "$OUT/generate.txt" 2>&1
    note "generate"; tail -4 "$OUT/generate.txt"
    ;;
steps)
    timeout 240 python benchmarks/ab_executor.py step-graphs --trials 6 --batches 1,2,4,8,16,32 --out "$OUT" \
        > "$OUT/ab_log.txt" 2>&1; note "ab"; grep -v "loading\|warm" "$OUT/ab_log.txt"
    python benchmarks/prepare_dataset.py --out /tmp/code.jsonl code --num-requests 32 --output-tokens 96
    note "dataset"
    timeout 200 python benchmarks/profile_step.py --dataset /tmp/code.jsonl --device cuda --dtype float32 \
        --modes ar,tree-serial,bole --batch-sizes 8,32 --out "$OUT" > "$OUT/profile_log.txt" 2>&1
    note "profile"; grep "tok/s" "$OUT/profile_log.txt" | sed 's/.*\r//'
    ;;
long)
    timeout 200 python benchmarks/bench_long_prefill.py --out "$OUT" --bounds 32000,8192,2048 --serve 8x4000 \
        > "$OUT/long_log.txt" 2>&1; note "long"; tail -8 "$OUT/long_log.txt"
    ;;
prefill-tests)
    python -m pytest -q -m gpu tests/models tests/spec tests/kernels/test_gdn_prefill.py \
        tests/kernels/test_tree_conv1d.py tests/kernels/test_kv_commit.py -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    python -m pytest -q tests/kernels/test_gdn_prefill.py tests/kernels/test_kv_commit.py tests/models/test_cache.py \
        tests/ops/test_validation.py -p no:cacheprovider > "$OUT/pytest_cuda.txt" 2>&1
    note "cuda tests"; tail -3 "$OUT/pytest_cuda.txt"
    ;;
gdn-inputs)
    python -m pytest -q -m gpu tests/models tests/spec tests/kernels/test_norms.py -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    python -m pytest -q tests/kernels/test_norms.py tests/ops tests/test_llm.py -p no:cacheprovider \
        > "$OUT/pytest_cuda.txt" 2>&1; note "cuda tests"; tail -3 "$OUT/pytest_cuda.txt"
    timeout 300 python benchmarks/ab_executor.py gdn-inputs --trials 6 --batches 8,32 --out "$OUT" \
        > "$OUT/ab_log.txt" 2>&1; note "ab"; grep -v "loading\|warm" "$OUT/ab_log.txt" | tail -5
    ;;
prefill-graphs)
    python -m pytest -q -m gpu tests/models tests/spec tests/kernels/test_gdn_prefill.py \
        tests/kernels/test_tree_conv1d.py tests/kernels/test_kv_commit.py -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    python -m pytest -q tests/kernels/test_gdn_prefill.py tests/models/test_cache.py tests/ops/test_validation.py \
        tests/test_llm.py -p no:cacheprovider > "$OUT/pytest_cuda.txt" 2>&1
    note "cuda tests"; tail -3 "$OUT/pytest_cuda.txt"
    timeout 300 python benchmarks/ab_executor.py prefill-graphs --trials "${TRIALS:-6}" --batches 1,8,16 \
        --requests 48 --out "$OUT" > "$OUT/ab_log.txt" 2>&1; note "ab"; grep -v "loading\|warm" "$OUT/ab_log.txt" | tail -5
    ;;
sampled)
    python -m pytest -q -m gpu tests/models/test_tree_verify.py tests/spec -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    for CHANGE in ${CHANGES:-sampled-acceptance unfiltered-sampling}; do
        timeout 200 python benchmarks/ab_executor.py "$CHANGE" --temperature 0.8 --trials "${TRIALS:-3}" \
            --batches "${BATCHES:-1,8,32}" --out "$OUT" > "$OUT/ab_log_$CHANGE.txt" 2>&1
        note "ab $CHANGE"; grep -v "loading\|warm" "$OUT/ab_log_$CHANGE.txt" | tail -4
    done
    python benchmarks/prepare_dataset.py --out /tmp/code.jsonl code --num-requests 32 --output-tokens 96
    note "dataset"
    timeout 100 python benchmarks/profile_step.py --dataset /tmp/code.jsonl --device cuda --dtype float32 \
        --modes bole --batch-sizes 8,32 --temperature 0.8 --out "$OUT" > "$OUT/profile_log.txt" 2>&1
    note "profile"; grep "tok/s" "$OUT/profile_log.txt" | sed 's/.*\r//'
    ;;
accept)
    python -m pytest -q -m gpu tests/spec/test_acceptance.py tests/spec/test_executor.py -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    timeout 300 python benchmarks/bench_sampled_accept.py --out "$OUT" > "$OUT/accept_log.txt" 2>&1
    note "bench"; tail -9 "$OUT/accept_log.txt"
    timeout 60 python benchmarks/probe_inverse_cdf.py --out "$OUT" > "$OUT/cdf_log.txt" 2>&1
    note "probe"; tail -4 "$OUT/cdf_log.txt"
    ;;
floor)
    python -m pytest -q tests/kernels/test_filter_floor.py tests/kernels/test_softmax_stats.py tests/ops tests/spec/test_sampling.py \
        -p no:cacheprovider \
        > "$OUT/pytest_cuda.txt" 2>&1; note "cuda tests"; tail -3 "$OUT/pytest_cuda.txt"
    python -m pytest -q -m gpu tests/spec/test_acceptance.py tests/spec/test_executor.py -p no:cacheprovider \
        > "$OUT/pytest_gpu.txt" 2>&1; note "gpu tests"; tail -3 "$OUT/pytest_gpu.txt"
    timeout 520 python benchmarks/bench_filter_floor.py --sweep --batches 1,2,4,8,32 --out "$OUT" > "$OUT/floor_log.txt" 2>&1
    note "bench"; grep -v "^sweep" "$OUT/floor_log.txt" | tail -30
    ;;
prefill)
    timeout 300 python benchmarks/bench_prefill.py --out "$OUT" > "$OUT/prefill_log.txt" 2>&1; note "prefill"
    tail -1 "$OUT/prefill_log.txt"
    ;;
ratios)
    timeout 280 python benchmarks/repeat_verify_ratio.py --out "$OUT" > "$OUT/log.txt" 2>&1; note "ratios"
    tail -4 "$OUT/log.txt"
    ;;
ncu)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    timeout 300 "$NCU" --clock-control none -k "regex:inverse|path_factors" --launch-skip 2 --launch-count 2 --set full \
        --import-source yes -o /tmp/phases -f python benchmarks/ncu_verify_phases.py launch > "$OUT/ncu_log.txt" 2>&1
    note "ncu"
    "$NCU" -i /tmp/phases.ncu-rep --page details --csv > /tmp/details.csv
    "$NCU" -i /tmp/phases.ncu-rep --page source --csv --print-source sass > /tmp/source.csv
    python benchmarks/ncu_verify_phases.py summarize /tmp/details.csv /tmp/source.csv --out "$OUT"
    note "summarize"
    ;;
attention)
    timeout 300 python benchmarks/bench_tree_attention.py --out "$OUT" > "$OUT/attention_log.txt" 2>&1
    note "bench"; tail -4 "$OUT/attention_log.txt"
    timeout 280 python benchmarks/ab_executor.py tree-attention --trials 6 --out "$OUT" > "$OUT/ab_log.txt" 2>&1
    note "ab"; tail -4 "$OUT/ab_log.txt"
    ;;
transposed)
    python benchmarks/probe_transposed_tiles.py --out "$OUT" > "$OUT/transposed_log.txt" 2>&1; note "probe"
    tail -6 "$OUT/transposed_log.txt"
    ;;
split)
    python benchmarks/probe_split_products.py --out "$OUT" > "$OUT/split_log.txt" 2>&1; note "probe"
    tail -5 "$OUT/split_log.txt"
    ;;
edits)
    python benchmarks/probe_source_edits.py --out "$OUT" > "$OUT/edits_log.txt" 2>&1; note "probe"
    tail -8 "$OUT/edits_log.txt"
    ;;
probe)
    python benchmarks/probe_value_bytes.py --out "$OUT" > "$OUT/probe_log.txt" 2>&1; note "probe"
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for V in base all; do
        timeout 200 "$NCU" --clock-control none -k regex:inverse --launch-skip 2 --launch-count 1 --set full \
            --import-source yes -o "/tmp/value_$V" -f python benchmarks/probe_value_bytes.py --launch "$V" \
            > "$OUT/ncu_log_$V.txt" 2>&1
        note "ncu $V"
        "$NCU" -i "/tmp/value_$V.ncu-rep" --page details --csv > "/tmp/details_$V.csv"
        "$NCU" -i "/tmp/value_$V.ncu-rep" --page source --csv --print-source sass > "/tmp/source_$V.csv"
        python benchmarks/ncu_verify_phases.py summarize "/tmp/details_$V.csv" "/tmp/source_$V.csv" --out "$OUT" \
            --stem "ncu_value_tiles_${V}" \
            --profiled "bash benchmarks/h200.sh probe (ncu --set full on probe_value_bytes.py --launch $V)"
        note "summarize $V"
    done
    ;;
*)
    echo "usage: bash benchmarks/h200.sh TARGET, one of: kernels engine commit-paths aot serving repeats acceptance realdims train configs depth ops tests steps long prefill-tests gdn-inputs prefill-graphs sampled accept floor prefill ratios ncu attention transposed probe (the header says what each runs)" >&2
    exit 2 ;;
esac
exit $RC
