#!/usr/bin/env bash
# Side by side with llama.cpp on the 27B shape, where the GPU machine's 64 GB disk allows: Q4_K_M only.
# The anchor's own path (a BF16 GGUF, then llama-quantize) needs the 54 GB checkpoint and the 54 GB BF16
# GGUF at once. Here the anchor's checkpoint code (its python, run with bf16 as the default dtype: the
# float32 model would not fit an H100) writes the checkpoint, llama.cpp's converter makes a Q8_0 GGUF of
# it, and llama-quantize (--allow-requantize) makes Q4_K_M of that; the checkpoint and the Q8_0 file go
# to /dev/shm or disk, whichever has room. Then llama-bench, and in the next call `hyspec bench`.
#   bench/compare_llamacpp_27b.sh start    # starts it detached, then waits for it (WAIT_S, default 540 s)
#   bench/compare_llamacpp_27b.sh finish   # in the next call: waits for the rest, then hyspec bench
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?start|finish}
W=/tmp/anchor27; OUT=${OUT:-/tmp/hyspec-out}
mkdir -p "$W" "$OUT"
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
M=$W/27b-q4km.gguf
if [ "$MODE" = start ]; then
  df -BG / /dev/shm | tee "$W/df.txt"
  disk=$(df -BG --output=avail / | tail -1 | tr -dc 0-9); shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
  if [ "$shm" -ge 60 ]; then HF=/dev/shm/hf27; Q8=$W/27b-q8_0.gguf
  elif [ "$shm" -ge 30 ] && [ "$disk" -ge 58 ]; then HF=$W/hf; Q8=/dev/shm/27b-q8_0.gguf
  else echo "no room: ${disk}G disk, ${shm}G /dev/shm"; exit 3; fi
  echo "checkpoint in $HF, Q8_0 in $Q8"
  mkdir -p "$W/llama.cpp" && tar xJf .anchor/llama.cpp-src.tar.xz -C "$W/llama.cpp"
  # The anchor's checkpoint maker, verbatim (its python heredoc), run with bf16 as the default dtype.
  sed -n '/^python3 - "\$SHAPE" "\$W\/hf" <<'"'"'PY'"'"'$/,/^PY$/p' .anchor/llamacpp_anchor.sh | sed '1d;$d' > "$W/make_ckpt.py"
  cat > "$W/run.sh" <<EOF
set -x
L=$W/llama.cpp
( cd \$L && cmake -S . -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \\
    -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \\
  cmake --build build -j "\$(nproc)" --target llama-bench llama-quantize > $W/build.log 2>&1 ) &
BUILD=\$!
python3 -c "import sys, torch, runpy; torch.set_default_dtype(torch.bfloat16); sys.argv = ['make_ckpt', '27b', '$HF']; runpy.run_path('$W/make_ckpt.py', run_name='__main__')"
wait \$BUILD
PYTHONPATH=\$L/gguf-py:\$L python3 -c "
import sys; sys.argv=['c','$HF','--outfile','$Q8','--outtype','q8_0','--no-mtp']
import conversion.base as b; b.TextModel.get_vocab_base_pre=lambda self,tok:'qwen35'
import runpy; runpy.run_path('\$L/convert_hf_to_gguf.py', run_name='__main__')" > $W/convert.log 2>&1
rm -rf $HF
\$L/build/bin/llama-quantize --allow-requantize $Q8 $M Q4_K_M > $W/quant.log 2>&1
rm -f $Q8
B=\$L/build/bin/llama-bench
\$B -m $M -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>$W/bench.err | grep '^|' || tail -5 $W/bench.err
\$B -m $M -ngl 99 -fa 1 -p 1,2,4,8,16,32 -n 0 -r 5 -o md 2>>$W/bench.err | grep '^|'
EOF
  setsid nohup bash -c "bash $W/run.sh > $W/anchor.md 2> $W/anchor.err; echo done > $W/anchor.done" > /dev/null 2>&1 &
  echo "27B anchor started in $W"
  # The machine goes back when a call ends idle: keep this call until the anchor is done or time is up.
  while [ ! -f "$W/anchor.done" ] && [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do sleep 5; done
  echo "after ${SECONDS}s: $(ls $W | tr '\n' ' ')"; df -BG / /dev/shm | tail -2; tail -3 "$W/anchor.err"
  exit 0
fi
for _ in $(seq 1 110); do [ -f "$W/anchor.done" ] && break; sleep 5; done
if [ ! -f "$W/anchor.done" ]; then
  echo "still running: $(ls $W) $(df -BG / /dev/shm | tail -2 | tr '\n' ' ')"; tail -3 "$W/anchor.err"; exit 3
fi
echo "== llama.cpp (llama-bench, -fa 1, -ngl 99), 27B Q4_K_M"; cat "$W/anchor.md"; tail -5 "$W/anchor.err"
cp "$W/anchor.md" "$OUT/llamacpp27.md"
[ -f "$M" ] || { echo "no $M"; tail -20 "$W"/*.log; exit 3; }
ls -la "$M"
.device/bin/hyspec info "$M" 2>&1 | head -20
.device/bin/hyspec bench -m "$M" --backend cuda -p 512 -n 128 -d 0,16384 --verify 1,4,16 -c 17000 --kv-type f16 2>&1 |
  tee "$OUT/hyspec27.md"
