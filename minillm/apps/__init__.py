"""The applications built on the engine: ``minillm`` on the command line (``cli``), the chat REPL
(``chat_repl``), the course's JupyterLab (``lab``, ``lab_contents``), the OpenAI-compatible server
(``serve``), the benchmarks (``bench``) and the random-program fuzzer (``fuzz``). The engine never
imports them."""
