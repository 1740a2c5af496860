#!/usr/bin/env bash
# The GPU measurements issue #13 asks for, as one prepared run for a short lease of a GPU machine
# that has PyTorch but no internet and not all of gors' dependencies (the workplace's H200 image
# lacks diffusers, open_clip (whose bundled CLIP vocabulary the tokenizers of the test models are
# written from), pooch and platformdirs, and holds an older transformers and a peft of unknown
# version; its huggingface_hub, 1.33, suits them).
#
#   benchmarks/gpu_session.sh prepare     # here, with the package registry: the missing wheels into .whl/
#   benchmarks/gpu_session.sh run         # there (carry .whl): install them, measure what #13 still lacks
#   benchmarks/gpu_session.sh run table   # there: the whole full-size speed table and cost model again
#   benchmarks/gpu_session.sh run compiled  # there, a second command: the training step with --torch_compile inductor
#   benchmarks/gpu_session.sh run extras    # there, if time remains: Soft-TIFA in float32, SD3/FLUX training memory, ...
#   benchmarks/gpu_session.sh run memory [FAMILIES]  # there: training memory (default sd, measured 2026-12-04)
#   benchmarks/gpu_session.sh run generation:150 overlap:70   # there: these speed scripts, seconds each
#
# Each mode installs the wheels, then measures, each script under its own time limit so that one
# slow script does not cost the others. `run` measures what the first H200 run
# (benchmarks/results/2026-12-04-h200) left open, in this order: the seconds-long checks of the
# paths only a GPU exercises (gpu_checks.py); the training step at batch 2 again (since the first run,
# gors' LoRA layers are fused and their weights cast at once: 40 % fewer operations dispatched, though
# on the CPU's host-bound stand-in no less host time) and with both LoRAs at batch 16 on one GPU (the
# official global batch of 2 x 8 GPUs) per sample against the official loop at 2; the cost model
# calibrated at that batch and priced with that ratio and the 2026-12-04 B-VQA and generation
# ratios; the step at batch 2 with both LoRAs compiled and replayed as CUDA graphs
# (`--torch_compile inductor:reduce-overhead`), its first three losses checked against the official
# loop's. `run extras`: Soft-TIFA's float32 agreement at full depth; SD3.5 Medium's and FLUX.1's
# training memory in the setting of their targets; the training step against the official loop run at
# gors' fp16 (every other training row's reference trains in fp32, as GORS' script did), and gors' step in
# fp32 against it; the MLLM-CoT judge at Qwen3-VL-8B's full size against both official procedures (4 images,
# answers cut at 48 tokens: random weights write to the limit, and 300 tokens a turn would outrun the lease).
# Their limits add up to 530 s. `run compiled` times the training step with
# `--torch_compile inductor` (compiling takes minutes). `run table` runs what the first run did: the speed scripts at the real architecture
# sizes (Soft-TIFA, B-VQA, training, generation), the cost model priced with the ratios just
# measured, then overlapped scoring. Every script writes its table as it finishes; the logs and
# tables land in ./gpu_out, or, on the device machine (which returns at most 8 files from $OUT),
# in one $OUT/gpu_results.tar.gz made again after each script, so that a command stopped at its
# time limit still returns what finished.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pure-Python wheels the device lacks, at versions gors is tested with (pyproject.toml). transformers stays at
# 5.24.0, the last before 5.25 raised its huggingface_hub requirement to >= 2.4 (the device has 1.33).
WHEELS=(diffusers==0.42.1 transformers==5.24.0 peft==0.21.2 open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4
        pooch==1.8.2 platformdirs==4.3.8 importlib_metadata==8.7.0 zipp==3.23.0)

prepare() {
    grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
        --platform any -d .whl "${WHEELS[@]}"
    du -sh .whl
}

measure() {  # measure NAME SECONDS COMMAND...: one measurement, its log in $out, its failure not fatal
    local name=$1 seconds=$2
    shift 2
    echo "[gpu_session] $name (at most ${seconds} s)"
    local rc=0
    timeout "$seconds" "$@" > "$out/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "[gpu_session] $name did not finish (exit $rc, 124: out of time); its log: $name.log"
    fi
    tail -n 20 "$out/$name.log"
    bundle
}

bundle() {  # everything in $out so far as one archive in $OUT, replaced whole (only on the device machine)
    [ -n "${OUT:-}" ] || return 0
    tar -czf "$OUT/gpu_results.tar.gz.part" -C "$out" . && mv -f "$OUT/gpu_results.tar.gz.part" "$OUT/gpu_results.tar.gz"
}

run() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    out=${OUT:+/tmp/gpu_results}
    out=${out:-gpu_out}
    mkdir -p "$out"
    nvidia-smi > "$out/nvidia-smi.txt"
    python3 -c "import torch, transformers, diffusers; print(torch.__version__, transformers.__version__, diffusers.__version__)"
    if [ "${1:-}" = compiled ]; then  # a second command: inductor compiles the U-Net's training graphs twice
        measure train_step_compiled 280 python3 -m benchmarks --device cuda --full-size --only train_step \
            --torch_compile inductor --output "$out/train_step_compiled.md"
        return
    fi
    if [ "${1:-}" = extras ]; then
        measure soft_tifa_float32 100 python3 benchmarks/soft_tifa_one_pass.py --device cuda --full-size \
            --dtype float32 --images 2 --repeats 2
        # The memory targets of the large families, in the setting they are stated for.
        measure train_memory_large 150 python3 benchmarks/train_memory.py --device cuda --families sd3,flux \
            --checkpointing on --cached on
        # The training step against the official loop at gors' fp16 (the official trained in fp32, `run`'s reference).
        measure train_step_equal_precision 100 python3 benchmarks/train_step.py --device cuda --full-size \
            --both_loras_only --reference_precision fp16
        # gors in fp32 too: at a launch-bound batch its step may cost no more than in fp16, without autocast's casts.
        measure train_step_fp32 60 python3 benchmarks/train_step.py --device cuda --full-size --both_loras_only \
            --mixed_precision no --repeats 4
        measure mllm_cot 120 python3 benchmarks/mllm_cot.py --device cuda --full-size --images 4 \
            --max_new_tokens 48 --repeats 2
        return
    fi
    if [ "${1:-}" = memory ]; then
        measure train_memory 120 python3 benchmarks/train_memory.py --device cuda --families "${2:-sd}"
        return
    fi
    if [ $# -gt 0 ] && [ "$1" != table ]; then  # run NAME:SECONDS ...: those speed scripts again, e.g. one that ran out of time
        for entry in "$@"; do
            measure "${entry%%:*}" "${entry##*:}" python3 -m benchmarks --device cuda --full-size --only "${entry%%:*}" \
                --output "$out/${entry%%:*}.md"
        done
        return
    fi
    # The scripts' limits add up to 500 s (590 for `table`, which can outrun a 600 s command if every script runs to
    # its limit; the first H200 run, 2026-12-04, took 28, 17, 44 and 79 s for Soft-TIFA, B-VQA, training and
    # generation, 322 s in all).
    measure gpu_checks 30 python3 benchmarks/gpu_checks.py
    local first=benchmarks/results/2026-12-04-h200
    if [ "${1:-}" = table ]; then
        for entry in soft_tifa_one_pass:60 b_vqa_passes:40 train_step:90 generation:150; do
            script=${entry%%:*}
            measure "$script" "${entry##*:}" python3 -m benchmarks --device cuda --full-size --only "$script" \
                --output "$out/$script.md"
        done
        # The ratios that price the estimate's official column: those of the scripts above that finished.
        local speedups=()
        for script in b_vqa_passes train_step generation; do
            [ -f "$out/$script.json" ] && speedups+=("$out/$script.json")
        done
        measure cost_model 150 python3 benchmarks/cost_model.py --device cuda --full-size --output "$out/cost_model.md" \
            ${speedups[@]:+--speedups "${speedups[@]}"}
        measure overlap 70 python3 -m benchmarks --device cuda --full-size --only overlap --output "$out/overlap.md"
    else
        measure train_step_16 120 python3 -m benchmarks --device cuda --full-size --only train_step \
            --gors_batch_size 16 --output "$out/train_step_16.md"
        if [ -f "$out/train_step_16.json" ]; then
            # B-VQA's and generation's ratios are the first H200 run's: on another GPU the estimate says so.
            measure cost_model_16 150 python3 benchmarks/cost_model.py --device cuda --full-size --train_batch_size 16 \
                --output "$out/cost_model_16.md" \
                --speedups "$first/b_vqa_passes.json" "$first/generation.json" "$out/train_step_16.json"
        fi
        # GORS' batch of 2 without the host's launches: inductor's graphs replayed as CUDA graphs.
        measure train_step_graphs 200 python3 benchmarks/train_step.py --device cuda --full-size --repeats 8 \
            --torch_compile inductor:reduce-overhead --both_loras_only
    fi
    cat "$out"/*.md 2>/dev/null || true
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run [table | compiled | extras | memory [FAMILIES] | NAME:SECONDS ...]" >&2; exit 2 ;;
esac
