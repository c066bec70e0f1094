"""Python threads (issue 33): LanguageModels of their own on 1, 2 and 4 threads, all made
from one loaded library (tests/fixtures/llm/llm_consts.so), each generating 64 tokens after a
32-token prompt 6 times; prints the time per generation and the throughput against one thread.
The GIL is released while mblob runs kernels, so the threads run in parallel as far as the
cores allow. Run with the package installed and MBLOB_NUM_THREADS=1 (one kernel thread each):

    MBLOB_NUM_THREADS=1 python benches/python_threads.py
"""
import json, os, time
from concurrent.futures import ThreadPoolExecutor
import mblob
LLM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "llm")
m = mblob.load_module(os.path.join(LLM, "llm_consts.so"))
prompt = list(range(1, 33))
def bench(threads, per=6):
    lms = [mblob.LanguageModel(m) for _ in range(threads)]
    for lm in lms: lm.generate(prompt, 8)
    def work(lm):
        for _ in range(per): lm.generate(prompt, 64)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool: list(pool.map(work, lms))
    return (time.perf_counter() - t) / (threads * per)
for rep in range(2):
    one = bench(1); two = bench(2); four = bench(4)
    print(f"per generation: 1 thread {one*1e3:.1f} ms, 2 threads {two*1e3:.1f} ms, 4 threads {four*1e3:.1f} ms; throughput x{one/two:.2f} (2), x{one/four:.2f} (4); load {os.getloadavg()[0]:.1f}")
