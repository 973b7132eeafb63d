"""`python -m enginesim sglang <flags>`, `python -m enginesim vllm serve <model> <flags>`, or
`python -m enginesim replay <either of those> --isl N --osl N ...` (pure virtual time, no server), or
a P/D router: `python -m enginesim sglang_router <flags>` / `python -m enginesim vllm_proxy <flags>`, or
a tokenizer directory for clients that need one: `python -m enginesim tokenizer-dir OUT --model-path M`."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["replay"]:
        from .replay import main as replay_main

        sys.exit(replay_main(sys.argv[2:]))
    if sys.argv[1:2] == ["tokenizer-dir"]:
        from .tokenizer_dir import main as tokenizer_dir_main

        sys.exit(tokenizer_dir_main(sys.argv[2:]))
    if sys.argv[1:2] in (["sglang_router"], ["vllm_proxy"]):
        from .pd_router import main as router_main

        sys.exit(router_main(sys.argv[1:]))
    from .server import main

    sys.exit(main(sys.argv[1:]))
