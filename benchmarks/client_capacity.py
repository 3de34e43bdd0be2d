"""How many concurrent streams and tokens/s the lab's HTTP client sustains before its own timestamping lags,
beside vLLM's benchmark client (``vllm bench serve``) on the same server.

    python benchmarks/client_capacity.py [--levels 1,2,4,...,512] [--itl-s 0.01] [--level-s 2]
        [--max-level-s 20] [--clients lab,vllm,lab@REV] [--parse-rev REV] [--parse-only | --no-parse]
        [--profile FILE --profile-level C] [--keep DIR]

``lab@REV`` (a client) and ``--parse-rev REV``: the lab's parse path (``lablib/engines/http/sse.py`` and
``protocol.py``) as of git revision REV, beside the current one: before and after a change, in one run.

``LABLIB_QUICK=1``: levels 1,8,64, 1 s per level, the parse section with fewer rounds.

**The server** is ``benchmarks/fast_server.py`` in a process of its own (its own GIL): vLLM's
``/v1/completions`` stream with a model that costs nothing, one decode step every ``--itl-s`` seconds for
all streams in flight (a batch), exactly ``max_tokens`` tokens per stream, and the true send time of every
token (``time.perf_counter`` just before the write; on Linux ``CLOCK_MONOTONIC``, the same clock in every
process, so the lab's stamps and vllm bench's are on the server's time line: checked at the start by
``GET /clock``, printed ``# clock:``). The first token's text is the request's tag, which both clients keep
(the lab's rows' ``text``, vllm bench's ``generated_texts``), so every client-side stamp is matched to the
send time of the same token.

**Per level** (concurrency C): a closed loop of C clients, 2 C requests of N tokens (N = ``--level-s`` /
2 / ``--itl-s``: each level lasts about ``--level-s`` when the client keeps up, at most ``--max-level-s``),
prompts of 8 tokens; first the lab's client (:func:`lablib.measure.load.run_load` on the ``http`` engine,
with :class:`lablib.measure.headroom.LoopLagProbe` on its loop), then vllm bench (one process kept for all
levels, as ``benchmarks/vllm_anchor.py`` runs it; the same request body: the lab's extra fields as
``--extra-body``, so the server writes the same bytes to both), in alternating order level by level.

**Columns.** ``tok_s``: the client's own output tokens/s (the lab: output tokens over the makespan; vllm:
its ``output_throughput``). ``server_tok_s``: what the server sent during the level (its tokens over its
first to last send). ``delay_p99_ms``: a token's client stamp minus its send time, p99 over every token.
``added_itl_p50_ms`` / ``added_itl_p99_ms``: per token i >= 1 of a stream, the client's ITL minus the
server's (``delay[i] - delay[i-1]``): what the client added to the ITL it reports; the limit is its p99
above 0.1 ms (:data:`ADDED_ITL_LIMIT_S`). ``edge_p99_ms`` / ``mid_p99_ms``: that p99 over the tokens sent
within 1.5 server steps (:data:`EDGE_STEPS`) of any request's first or last token (a request starting or
ending: the client's own work for it runs then) and over the others: where a client's added delay comes
from. ``itl_p50_ms`` / ``itl_p99_ms``: the ITL the client reports
(the lab: ``itl_s`` of every token; vllm: ``median_itl_ms``, ``p99_itl_ms``). ``lag_p99_ms`` and
``near``: the lab's loop-lag probe (:func:`lablib.measure.headroom.client_headroom`). ``clock_ok``: every
token's stamp came after its send time.

**The parse section** (first, ``# parse``) feeds the same bytes (one stream of 2000 tokens, 1, 16 or 256
events per network read) through each client's own read loop, in this process, interleaved, best of
several rounds: the lab's (the body of ``HTTPEngine.agenerate``'s ``async for`` loop, read from
``lablib/engines/http/engine.py`` with :mod:`ast`, and its ``_StreamState.finish``) and vLLM's (the
``async for`` body of ``async_request_openai_completions`` and its ``StreamedResponseHandler``, read from
vLLM's installed ``vllm/benchmarks/lib/endpoint_request_func.py``). Microseconds of this thread's CPU time
(``time.thread_time``) per token, best of ``--parse-rounds``; no network.

``cpu_us_tok``: the client process's CPU time (every thread, ``/proc/<pid>/stat`` sampled every 20 ms) over
its own window (first request sent to last token) per token: what the client costs, whatever else ran
on the cores meanwhile (this machine's other work moves every other column by tens of percent).

**Measured** (2-core AMD EPYC VM shared with other workers' vLLM and llama servers and test runs, load
average 4.1 at the start, 3.1 at the end; ``python benchmarks/client_capacity.py --clients
lab,lab@499ef75,vllm --parse-rev 499ef75``, 129 s; ``lab@HEAD`` below is the lab's parse path as of 499ef75,
before this benchmark's changes to ``sse.py`` and ``protocol.py``). The parse section, microseconds of CPU per token at 1 / 16 / 256
events per read: lab 12.8 / 9.5 / 5.7, lab@HEAD 22.6 / 16.6 / 16.3, vLLM 15.6 / 8.5 / 6.0. The sweep
(itl 10 ms, 100 tokens per request; tok_s, cpu_us_tok, added_itl_p99_ms, delay_p50_ms)::

    C     lab                        lab@HEAD                   vllm
    1     100   -     1.2   0.25     100   600  5.0   0.27     100   500  4.0   0.39
    16    1579  -     3.5   0.77     1577  -    3.4   0.79     1571  72   0.6   0.82
    64    6059  56    3.3   2.3      5981  87   6.3   2.9      5983  67   2.5   2.7
    128   10906 60    22    5.3      10371 72   18    7.9      11033 66   7.0   5.2
    256   19802 34    89    31       18443 37   213   101      18725 34   83    35
    512   14971 30    630   540      14008 33   853   802      17588 25   273   134

Every level of every client was exact (``token_ids``, N tokens per request), with every stamp after its send
time. The added ITL's p99 is above 0.1 ms from one stream on, for both clients: this machine's scheduling
(other processes on two cores) delays a wake-up by milliseconds at the p99, which no client can get under.
Both clients keep up (tokens/s at least 95 % of the server's) to 64-128 streams, the server itself falling
behind its 10 ms steps from 64 streams on (it shares the two cores); past that every stamp is late by tens
to hundreds of ms (``delay_p50_ms``) and many tokens arrive in one read (``itl_p50_ms`` 0). Per token both
clients cost about the same CPU (lab@HEAD 10-50 % more); a fit of CPU per request at C=128 over 16 and 200
tokens per request gave the lab ~31 us per token and ~0.9 ms per request, vLLM ~35 us and ~1.35 ms. Run
to run at C >= 256, tokens/s moved by 20-40 % for every client: read the columns' shape and the CPU per token.

**Pooled connections** (the lab's client with vLLM's kind since then; ``lab-close``: one connection per
request, as before). Two runs on a quieter machine (load 0.9 -> 1.0; ``--levels 1,64,128,256,512`` then
``--levels 128,256,512``, ``--clients lab,lab-close,vllm --no-parse``, 72 s each), same columns::

    C     lab                          lab-close                    vllm
    128   11730 77  10   6.2 | 11623   10888 81  15  5.7 | 11205   10723 82  12   6.5 | 11019
    256   21705 46  67  23   | 19696   18111 55  48  21  | 20313   18915 53  24  13   | 18596
    512   34347 29  165 80   | 35103   25248 39  182 94  | 27475   26448 36  113 61   | 28439

(after ``|``: the second run's tok_s). At 256 and 512 streams every client's loop is saturated (tok_s x CPU per
token is about one core): what a client sustains there is its capacity, the lab's 1.06-1.23x vLLM's client's,
at the lowest CPU per token of the three; its stamps wait longer in that saturated loop (delay p50 1.3-2x),
which ``near_limit`` flags in every such run. Below saturation (128 streams) the lab's added ITL p99 is about
twice vLLM's client's (10-11 vs 5.5-12 ms): the lab's rows are taken off in another thread (the GIL).

**Several client processes** (``lab-p2``: :func:`lablib.measure.load.run_load_processes`, two processes on one
start and one clock). The server pinned to one core and every client to the other (``--server-cpus 0
--client-cpus 1``), 2-core AMD EPYC (AVX2), 2026-12-05; ``--levels 1,16,64,128,256,512,1024 --clients
lab,lab-p2,vllm --no-parse``, 183 s (tok_s, added_itl_p99_ms, delay_p50_ms)::

    C     lab                  lab-p2               vllm
    1     100   0.16  0.21     101   3.3   0.21     101   1.5   0.35
    16    1583  2.2   0.60     1569  1.6   0.66     1579  4.0   0.57
    64    6095  5.1   1.8      3509  4.4   1.6      5567  9.1   1.7
    128   12146 5.4   2.8      10068 4.1   3.0      10705 25    7.1
    256   22045 15    8.3      18793 18    7.0      19634 46    25
    512   25999 214   142      28089 60    27       27771 111   39
    1024  19171 844   496      28363 339   143      34796 353   200

and a second run of lab and lab-p2 alone (``--levels 64,128,512,1024``, 93 s): lab 6143 / 11726 / 20671 /
48350 tok/s, lab-p2 4906 / 9288 / 18385 / 37159. With the clients on one core, two processes share that
core: they add no CPU, only a second loop to schedule (their loops' lag p99 300-1100 ms against the one
process's 8-520 ms), and which of the two delivers more at 512-1024 streams changed from run to run. So
here the spread gains nothing, and ``--client-processes auto`` (at most the usable cores less one) keeps one
process on this machine; on a 16-core GPU host it gives a process per 128 streams. Every level of every
client was exact with every stamp after its send time; vLLM's client did better than the lab's at 1024
streams in the first run (34796 vs 19171-28363 tok/s) and the lab's at 64-512 in both.

Repeated, alternating (the same machine and day), tok/s lab vs vllm: unpinned, ``--levels
512,1024,512,1024,512,1024 --clients lab,vllm --no-parse`` (89 s): 512 streams 39128 / 35609, 36814 / 34582,
29967 / 29649; 1024 streams 52693 / 43776, 30506 / 30456, 32130 / 22407 (the lab's client delivered at least as
much in every pair). Pinned as above, ``--levels 1024,1024,1024 --clients lab,vllm,lab-p2``: lab 22132, 29251,
31401; vllm 23153, 28586, 28135; lab-p2 21577, 22741, 22127 (with delay p50 40-51 ms against the single
process's 81-227 ms: two loops stamp sooner, on one core they deliver less). At these levels every client is
past its limit (all tokens late by tens to hundreds of ms): the lab's added ITL p99 was 1.2-2.7 times vLLM's
client's (its rows are built and written beside the loop, in the same process).

**Rows off the loop** (2026-12-05, the same 2-core machine, unpinned, shared with other workers' tests; load 2.8-3.8).
A profile of the loop thread at 512 streams (``--profile-level 512``, one level) put 35 % of its time in the lab's
event parsing (``protocol.event``: JSON, the token count), about as much in aiohttp's chunk reading, 6 % in epoll
and 4 % in making the finished requests' rows (``request_row``, ``trace_row``, ``flatten_manifest``, the queue).
Since then the loop hands over a finished request's trace and the calling thread makes its row
(``lablib.measure.load._Rows``). ``--levels 512,1024,512,1024 --clients lab,vllm --no-parse``, before (a worktree
of the commit before) and after, one run each (added_itl_p99_ms lab / vllm and their ratio; tok_s lab / vllm)::

    C      before                               after
    512    645 / 149  4.3x   19070 / 24451      321 / 139  2.3x   28550 / 27434
    1024   303 / 419  0.72x  22117 / 21273      476 / 285  1.7x   33876 / 27898
    512    361 / 172  2.1x   18124 / 17938      272 / 168  1.6x   33238 / 31092
    1024   926 / 494  1.9x   19207 / 19626      743 / 501  1.5x   24633 / 22347

After, the lab's added ITL p99 was 1.5-2.3 times vLLM's client's (0.7-4.3 before) and its tok/s 1.04-1.21 times
(0.78-1.04 before). Every level of both runs past its client's limit, with stamps hundreds of ms late, on a machine
whose other work moves each column by tens of percent from run to run: two runs show the direction, not the size.
The parse itself stays on the loop: a token's count is what its stamp needs.

**A frozen heap, and uvloop** (2026-12-05, the same 2-core AVX2 EPYC, quiet: load 0.2-1.4; server on core 0,
clients on core 1). Garbage collection: at 512-1,024 streams a level had 2-3 full collections of the lab's
process, the longest 190-270 ms (about 312,000 objects: modules, tokenizer), with the stamping loop stopped through
each (``gc.callbacks``, 3 levels each way). Since then a load run freezes the heap it found
(``lablib.measure.headroom.frozen_heap``): a full collection during a level took 20 ms. And the engine's loop
is uvloop where installed (``lab``; ``lab-asyncio`` the standard library's loop, heap frozen too).
``--levels 1,16,64,128,256,512,1024 --clients lab,lab-asyncio,vllm --no-parse --server-cpus 0 --client-cpus 1``,
81 s; before (uvloop, heap not frozen) one run, after two (added_itl_p99_ms; tok_s)::

    C      lab before      lab after                   lab-asyncio after           vllm (3 runs)
    64     0.93  6263      1.31 / 1.13   6285 / 6283   3.27 / 1.31   6270 / 6279   1.90 / 1.56 / 0.87  6022-6136
    256    11.3  21692     3.87 / 7.63  23447 / 23633  9.98 / 8.27  23506 / 23441  9.36 / 15.6 / 4.90  21407-22156
    512    63.8  35913     27.7 / 63.4  43235 / 42179  34.8 / 54.6  43427 / 42873  28.5 / 29.0 / 51.8  34884-37646
    1024   284   45354     183 / 221    64467 / 61786  183 / 234    62264 / 61901  138 / 133 / 135     43252-46961

The lab's client delivered 1.07-1.43x vLLM's client's tokens/s at 256-1,024 streams in every run, at less CPU
per token (15.6-16.2 us at 1,024 streams against 19.9-21.1), every token exact and stamped after its send. Its
added ITL p99, pair by pair within a run: lower than vLLM's client's in 7 of 14 (1 and 128 streams in both runs;
64, 256 and 512 in one), higher at 16 streams (0.52-0.63 ms against 0.47-0.50), and 1.4-1.7x at 1,024, where both
loops are saturated (tokens/s x CPU per token is one core) and the lab's serves a server sending 1.3-1.4x as
many tokens: there every client is past its limit (``near_limit`` says so), and what lowers a stamp's wait
is more cores (``lab-pN``). uvloop against asyncio: the loop's lag p99 at 256 streams 40-44 ms against 110-116,
the added ITL p99 lower in 11 of 14 pairs, tokens/s the same.

**No timer per read** (2026-12-05, the same 2-core AVX2 EPYC, quiet: load about 1; server on core 0, clients on
core 1). A py-spy profile of the loop thread while it held the GIL (1,024 streams, ``--itl-s 0.04``) put 13 % of
its time in aiohttp's ``sock_read`` timer, which cancels and re-schedules a timer handle at every network read.
Since then the body's silence limit is the lab's own timer, re-armed about once per ``read_timeout_s``
(``lablib.engines.http.engine._ReadDeadline``); ``lab-sockread`` is the lab's client with aiohttp's timer, as
before, in the same process and run. ``--levels 512,1024,512,1024,512,1024 --clients lab,lab-sockread,vllm
--no-parse --server-cpus 0 --client-cpus 1`` (itl 10 ms: the loops saturated at 1,024), three pairs per level
(added_itl_p99_ms; delay_p50_ms; tok_s)::

    C      lab                                lab-sockread                       vllm
    512    54.3 / 31.8 / 35.0   21-24  41-43k   42.6 / 43.6 / 85.0   29-55  40-42k   30.5 / 28.3 / 25.8   19-20  37-38k
    1024   161 / 168 / 169    112-147  61-66k    178 / 231 / 207   137-156  50-65k    135 / 147 / 165   85-90  42-57k

An earlier run of the same comparison (a scratch script that swapped the timer as ``lab-sockread`` does): at 512
streams 26.7 / 33.4 / 32.7 against 44.3 / 38.6 / 63.7 (vllm 55.5 / 48.1 / 63.8), at 1,024 173 / 141 / 155 against
267 / 278 / 334 (vllm 128 / 181 / 169). So with aiohttp's timer the added ITL p99 at 1,024 streams was 1.1-2.2x
the lab's in 6 of 6 pairs, at 512 higher in 5 of 6; and vLLM's client's p99 at 512 moved by 2x between the runs. At 25
tokens/s a stream (``--itl-s 0.04 --level-s 6``, one token a read; the scratch script), 3 pairs: CPU per token at
256 streams 46.6 / 57.3 / 51.6 us against 59.9 / 61.7 / 58.3, at 1,024 41.0 / 39.2 / 40.4 against 44.7 / 42.7 /
43.4, the added ITL p99 (1,024: 76 / 59 / 74 against 114 / 73 / 118 ms) and the delay p50 lower in every pair. The
whole table afterwards (``--levels 1,16,64,128,256,512,1024 --clients lab,lab-sockread,vllm``, 2 runs, 84-87 s
each; added_itl_p99_ms lab / vllm, tok_s lab / vllm)::

    C      run 1                              run 2
    1      0.118 / 0.281    101 / 101         0.127 / 0.191    101 / 101
    16     0.527 / 0.641   1587 / 1581        0.923 / 0.683   1590 / 1576
    64     1.42 / 1.41     6220 / 6185        3.72 / 1.04     6184 / 6054
    128    2.77 / 3.32    12236 / 11516       3.92 / 2.36    12049 / 11674
    256    15.3 / 4.71    22344 / 20958       14.3 / 20.8    23105 / 21768
    512    45.7 / 41.9    41561 / 35771       51.0 / 96.0    41591 / 34626
    1024   157 / 150      57850 / 39850       178 / 167      60632 / 41719

The lab's client delivered at least vLLM's client's tokens/s at every level of every run (1.11-1.51x from 512
streams on), at less CPU per token at every level from 64 streams on. Its added ITL p99 was lower than vLLM's
client's in 6 of 14 pairs of the table; at 1,024 streams 1.02-1.19x vLLM's client's in the 5 pairs of the
three later runs (1.4-1.7x before this change; lower in 2 of 3 in the scratch run), with its loop serving a
server that sent 1.1-1.6x as many tokens.
Every client's p99 moves by 2-4x between runs at 64-512 streams (vLLM's at 256: 4.7 and 20.8 ms): one run
does not rank two clients there.

**orjson** (the same machine and day, pinned as above). After the timer, the largest part of the loop's GIL time
was reading each chunk's JSON (18 %, py-spy at 1,024 streams): ``lablib.engines.http.protocol.loads`` now uses
orjson where installed (the serve extra), 1.2 us for a vLLM chunk against 2.4 for the standard library's C scanner;
``lab-stdjson`` is the lab's client without it, in the same run. ``--levels 512,1024,512,1024,512,1024 --clients
lab,lab-stdjson,vllm`` (added_itl_p99_ms; delay_p50_ms; tok_s)::

    C      lab                                lab-stdjson                        vllm
    512    19.4 / 16.7 / 15.7   14-17  40-44k   17.7 / 45.5 / 22.9   20-25  41-42k   48.0 / 30.8 / 31.0   20-23  36-37k
    1024   103 / 160 / 134     78-97  63-67k    166 / 151 / 138    105-129  59-62k   127 / 122 / 133    69-75  42-53k

The lab's CPU per token at 1,024 streams 14.9-15.8 us against 15.9-17.0 without orjson (vLLM's client 18.7-21.1).
The whole table then, with both changes (``--levels 1,16,64,128,256,512,1024 --clients lab,vllm``, 2 runs of
61-62 s; added_itl_p99_ms lab / vllm, tok_s lab / vllm)::

    C      run 1                              run 2
    1      0.122 / 0.187    101 / 101         0.095 / 0.148    101 / 101
    16     0.540 / 0.417   1595 / 1586        0.568 / 0.379   1595 / 1594
    64     1.05 / 0.96     6285 / 6149        1.05 / 1.13     6281 / 6161
    128    2.01 / 3.21    12350 / 11786       1.79 / 2.02    12229 / 11904
    256    4.59 / 7.13    23455 / 22020       4.74 / 4.25    23729 / 21841
    512    29.4 / 34.1    42615 / 37558       42.5 / 30.3    42691 / 37396
    1024   107 / 124      58893 / 42591       106 / 139      63561 / 41693

The lab's client delivered at least vLLM's client's tokens/s at every level (1.13-1.52x from 512 streams on) at
less CPU per token from 64 streams on; its added ITL p99 was lower in 9 of 14 pairs, at 1,024 streams in both
(0.76-0.86x), and higher at 16 streams in both (0.54-0.57 ms against 0.38-0.42). Four more pairs at 16 streams
(a scratch run, the same client): lab 0.43-0.76, vllm 0.31-0.52 ms, the lab's lower in 1 of 4; its delay p50
lower in all 4 (0.24-0.35 against 0.37-0.46 ms). So at 16 streams the lab's stamps come sooner and its added ITL
p99 is about 0.1 ms above vLLM's client's: left as it is.

**A request's edges** (2026-12-05, the same 2-core AVX2 EPYC, quiet: load 0.1-1.5; server on core 0, clients on
core 1). That 0.1 ms at 16 streams was not the stamping of tokens: matched token by token, the lab's largest added
ITLs came in 3-4 server steps a level, each holding 7-15 of the 16 streams 1.2-1.5 ms late, all within 15 ms of
some requests ending and their clients' next ones starting (``edge_p99_ms`` and ``mid_p99_ms`` since). A closed
loop's client sent its next request in the same turn of the loop as its last ended, ahead of other streams'
tokens already read: a send costs the loop about 0.4 ms (the lab's ``queue_s`` p50 at one client, mostly
aiohttp's), and 8 clients ending at once cost the others' stamps milliseconds. Since then the client yields to the
loop once before it sends (``lablib.measure.load._closed``) and the ended request's row is handed over in the same
turn as the send, not before it. Before and after in one process (a scratch copy of this benchmark with the
driver as before swapped in; ``--levels 16`` eight times, 3,168 added ITLs a level; medians over the levels of
the p99 within 15 ms of a request's start or end / elsewhere / all)::

    lab before             2.76 / 0.37 / 0.57      lab after (yield, row after)  1.03 / 0.42 / 0.61
    lab (yield, row first) 0.83 / 0.46 / 0.57      vllm                          0.93 / 0.46 / 0.54

(the same comparison another time: before 3.66 / 0.45 / 0.70, yield 1.02 / 0.39 / 0.50, vllm 0.92 / 0.47 / 0.53).
Handing the row over first let the rows' thread take the GIL between the yield and the send: at one client
(``queue_s`` p50 over 200 requests, 4 runs alternating) 417 us before, 547 yielding with the row first, 460 with
the row after. With the change, ``--levels 16`` ten times, lab / vllm (medians; added_itl_p99_ms, edge_p99_ms,
mid_p99_ms): 0.451 / 0.445, 1.20 / 0.93, 0.37 / 0.38; another ten: 0.451 / 0.474, 1.44 / 1.05, 0.36 / 0.40. The
lab's edges are still later than vLLM's client's: with the rows made after the run instead (a scratch variant,
not kept: rows must reach the disk as requests end) its edge p99 was 1.03 in that second run; the rows' thread
holds the GIL through a burst of finished requests. The whole table (``--levels 1,16,64,128,256,512,1024
--clients lab,vllm --no-parse --server-cpus 0 --client-cpus 1``, 2 runs of 62-66 s; added_itl_p99_ms lab / vllm,
edge_p99_ms lab / vllm, tok_s lab / vllm)::

    C      run 1                                          run 2
    1      0.087 / 0.253   0.116 / 0.092    101 / 101     0.144 / 0.160   0.110 / 0.116    101 / 101
    16     0.462 / 0.525   2.45 / 0.849    1594 / 1585    0.481 / 0.628   0.707 / 1.12    1594 / 1577
    64     1.32 / 1.94     3.38 / 6.97     6278 / 6106    1.61 / 1.66     16.5 / 4.07     6210 / 6167
    128    1.83 / 2.03     20.0 / 11.8    12223 / 11737   2.01 / 3.08     26.5 / 23.9    12124 / 11688
    256    3.66 / 5.43     23.0 / 20.1    23648 / 22020   8.87 / 20.4     32.7 / 31.3    23196 / 19695
    512    28.6 / 32.3     62.4 / 36.3    41859 / 36629   32.3 / 92.6     80.6 / 89.7    41075 / 33294
    1024   123 / 158       216 / 82.7     65730 / 51380   229 / 110       240 / 110      53358 / 38473

The lab's client delivered at least vLLM's client's tokens/s at every level of both runs (1.14-1.39x from 512
streams on) at less CPU per token from 16 streams on, and its added ITL p99 was lower in 13 of 14 pairs: every
level but 1,024 streams in run 2 (2.1x, where it delivered 1.39x the tokens/s; every client there is past its limit
with stamps 60-370 ms late). At the edges its p99 was higher in 10 of 14 pairs: what is left to take.

**Rows written as ``lablib bench --out`` writes them** (the same machine and day, quiet, pinned as above). The ``lab``
column makes each row but writes none; ``lablib bench`` appends each to its ``.jsonl`` file as its request ends
(``lablib.results.store.ResultsWriter``: open, the row's JSON line, flush, fsync), in the rows' thread beside the
stamping loop. ``lab-write`` does that; ``lab-write-stdjson`` writes each line with ``json.dumps`` (155 us for a row
of 100 ITLs), as before the writer took orjson where installed (20 us). ``--levels 16,16,16,16,16,16,256,256,1024,1024
--clients lab,lab-write,lab-write-stdjson,vllm --no-parse --server-cpus 0 --client-cpus 1`` (148 s; medians over the
levels: added_itl_p99_ms, edge_p99_ms; tok_s)::

    C      lab                   lab-write             lab-write-stdjson     vllm
    16     0.491  0.894   1595   0.522  0.855   1596   0.438  1.34    1595   0.512  0.955   1584
    256    6.30   28.1   23473   9.67   35.0   23424   21.5   52.3   23397   20.8   48.9   20802
    1024   95.9   66.4   64137   161    88.1   55703   257    132    53558   136    123    42192

and with the fsync left out (a scratch variant, not kept; ``--levels 256,256,1024,1024``, 80 s): lab 3.40 / 92.9,
lab-write without fsync 3.60 / 109, lab-write 7.18 / 155, vllm 5.35 / 145 (added_itl_p99_ms at 256 / 1,024 streams).
So writing the rows as bench does costs the stamping loop little at 16 streams and, at 256-1,024, raises the added
ITL p99 1.5-2.1x against rows not written, most of it the fsync per row (its kernel work on the clients' core, and the rows'
thread taking the GIL back after it); orjson cut what writing added to it by 60-80 %. Written so, the lab's client was at
1.07-1.18x vLLM's client's p99 at 1,024 streams (delivering 1.32-1.38x its tokens/s) and below it at 256 in one run
of two. An fsync per row is the results' durability (a dead machine loses at most the rows in flight); one fsync per
burst of finished rows would keep it: left for a decision.

**Rows fsync'd at most about once a second** (``ResultsWriter(sync_every_s=LOAD_SYNC_S)``, as bench and replay now
write: each row still handed to the OS as its request ends, so a crash or kill of the lab loses none; the fsync, which
only a crash of the machine itself would need, with the first row a second or more after the last and at the run's
end). ``lab-write-fsync`` is the writer as before (an fsync per row). Two runs, ``--levels 16,16,16,16,256,256,1024,1024`` and ``--levels
256,256,256,1024,1024,1024``, ``--clients lab,lab-write,lab-write-fsync,vllm --no-parse --server-cpus 0 --client-cpus
1`` (the same machine, 2026-12-05; medians over the levels: added_itl_p99_ms, edge_p99_ms; tok_s)::

    C      n  lab                   lab-write             lab-write-fsync       vllm
    16     4  0.590  2.18    1596   0.499  1.34    1594   0.417  0.78    1595   0.508  0.93    1582
    256    5  4.01   21.5   22916   6.35   44.9   23164   9.07   25.9   23617   13.1   23.2   21688
    1024   5  102    96.9   63950   107    94.3   61887   160    112    50827   155    167    44652

So at 256-1,024 streams the fsync per row was most of what writing the rows cost the added ITL p99 (and, at 1,024,
the tokens/s): without it the rows written as bench writes them leave the p99 at 1.05-1.6x rows not written (before:
1.6-2.3x), under vLLM's client's at every level (0.98, 0.48, 0.69x) while delivering 1.01-1.39x its tokens/s. At 16
streams the four clients are within the levels' spread of each other (0.39-0.74 ms). Near the edges at 16 streams the
fsync per row did better (0.78 ms against 1.34): it releases the GIL after each row, where the rows' thread otherwise
holds it through a burst of finished requests while the loop waits to stamp.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import json
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fast_server import FastServer, stream_payloads  # noqa: E402

QUICK = os.environ.get("LABLIB_QUICK") == "1"
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LEVELS_QUICK = (1, 8, 64)
ADDED_ITL_LIMIT_S = 1e-4  # the client's added ITL at p99 above this: past its limit
EDGE_STEPS = 1.5  # a token within this many server steps of a request's first or last token: at its edge
KEEP_UP = 0.95  # a client whose tokens/s is this much of the server's sent tokens/s kept up
PROMPT_TOKENS = 8
TAG = re.compile(r"<r(\d+)>")


# --- matching a client's stamps to the server's send times ---------------------------------------
def _pct(vals, q):
    from lablib.results.tables import percentile

    return percentile(vals, q) if vals else None


def lab_arrivals(row: dict) -> list[float]:
    """A lab row's token stamps: ``t_first_token`` and its ``itl_s``, added up."""
    return list(itertools.accumulate(row["itl_s"], initial=row["t_first_token"]))


def vllm_arrivals(result: dict, i: int) -> list[float]:
    """vllm bench's stamps of request ``i`` (``--save-detailed``): its start, TTFT and ITLs added up."""
    return list(itertools.accumulate(result["itls"][i], initial=result["start_times"][i] + result["ttfts"][i]))


def compare(pairs, edge_s: float = 0.0) -> dict:
    """``pairs``: (client stamps, server send times) of each request. Delay = stamp - send per token;
    added ITL = the client's ITL minus the server's, per token after the first. ``edge_s``: a token sent
    within this many seconds of any request's first or last token (a request starting or ending: the
    client's own work for it runs then) counts in ``added_itl_p99_edge_s``, the others in
    ``added_itl_p99_mid_s`` (0: no split, both None)."""
    import bisect

    delays, added, edge, mid = [], [], [], []
    pairs = list(pairs)
    ok = [(arr, sent) for arr, sent in pairs if len(arr) == len(sent)]
    mismatched = len(pairs) - len(ok)
    bounds = sorted(t for _, sent in ok if sent for t in (sent[0], sent[-1]))

    def near(t: float) -> bool:
        k = bisect.bisect_left(bounds, t - edge_s)
        return k < len(bounds) and bounds[k] <= t + edge_s

    for arr, sent in ok:
        d = [a - s for a, s in zip(arr, sent)]
        delays += d
        for i in range(1, len(d)):
            added.append(d[i] - d[i - 1])
            if edge_s > 0:
                (edge if near(sent[i]) else mid).append(d[i] - d[i - 1])
    return {
        "tokens_matched": len(delays),
        "mismatched": mismatched,
        "clock_ok": bool(delays) and min(delays) > 0,
        "delay_min_s": min(delays) if delays else None,
        "delay_p50_s": _pct(delays, 50),
        "delay_p99_s": _pct(delays, 99),
        "added_itl_p50_s": _pct(added, 50),
        "added_itl_p99_s": _pct(added, 99),
        "added_itl_p99_edge_s": _pct(edge, 99),
        "added_itl_p99_mid_s": _pct(mid, 99),
        "edge_tokens": len(edge),
    }


def server_rate(log: list[dict]) -> float | None:
    """Tokens/s the server sent for these requests: their tokens over their first to last send."""
    sends = [t for r in log for t in r["t_send"]]
    return len(sends) / (max(sends) - min(sends)) if len(sends) > 1 and max(sends) > min(sends) else None


class CpuSampler:
    """The CPU time (user + system, every thread) of process ``pid``, read from ``/proc/<pid>/stat`` every
    ``interval_s`` seconds by a thread of this process, each read stamped with ``time.perf_counter``: a
    client's CPU per token over its own measured window, whatever else the machine's cores were doing
    (Linux; 10 ms ticks, so a window of a few seconds reads to about 1 %)."""

    def __init__(self, pid: int, interval_s: float = 0.02):
        import threading

        self.path, self.interval_s = f"/proc/{pid}/stat", interval_s
        self.tick = os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> float | None:
        try:
            with open(self.path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime (fields 14, 15 of stat)

    def _run(self):
        while not self._stop.is_set():
            cpu = self._read()
            if cpu is not None:
                self.samples.append((time.perf_counter(), cpu))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        cpu = self._read()  # a first read now, before the window it will measure opens
        if cpu is not None:
            self.samples.append((time.perf_counter(), cpu))
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: float, t1: float) -> float | None:
        """CPU seconds from the last read at or before ``t0`` to the first at or after ``t1`` (None: no such reads)."""
        before = [c for t, c in self.samples if t <= t0]
        after = [c for t, c in self.samples if t >= t1]
        return after[0] - before[-1] if before and after else None


def cpu_us_per_token(sampler: CpuSampler, t0: float, t1: float, tokens: int) -> float | None:
    cpu = sampler.between(t0, t1)
    return cpu / tokens * 1e6 if cpu is not None and tokens else None


# --- the two clients ------------------------------------------------------------------------------
def lab_level(
    engine,
    srv,
    c: int,
    n: int,
    max_s: float,
    manifest: dict | None = None,
    out: Path | None = None,
    sync_every_s: float | None = None,
) -> dict:
    """One level of the lab's client; ``out``: a .jsonl file each row is written to as its request ends, as
    ``lablib bench --out`` writes them (the ``lab-write`` client), made durable (fsync) at most every
    ``sync_every_s`` seconds and at the run's end (None: as bench does, ``LOAD_SYNC_S``; 0: every row)."""
    from lablib.engines.base import GenerationConfig
    from lablib.measure.headroom import LoopLagProbe, frozen_heap
    from lablib.measure.load import run_load

    srv.sendlog(clear=True)
    prompts = [[1000 + (i % 1000), 1 + i // 1000] + [7] * (PROMPT_TOKENS - 2) for i in range(2 * c)]
    cfg = GenerationConfig(max_new_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    # the heap frozen before the probe starts, as bench does: run_load's own full collection at its start (200 ms
    # after a level that wrote rows) is then of what was made since, not a lag of the probe's first tick
    with frozen_heap(), CpuSampler(os.getpid()) as cpu, LoopLagProbe().on(engine) as probe:
        writer = None
        if out is not None:
            from lablib.results.store import LOAD_SYNC_S, ResultsWriter

            writer = ResultsWriter(out, sync_every_s=LOAD_SYNC_S if sync_every_s is None else sync_every_s)
        rows = run_load(
            engine,
            prompts,
            "closed",
            concurrency=c,
            cfg=cfg,
            max_duration_s=max_s,
            manifest=manifest,
            on_row=None if writer is None else writer.append,
        )
        if writer is not None:
            writer.sync()  # as bench does at a run's end
        time.sleep(3 * cpu.interval_s)  # a read after the last token
    wall = time.perf_counter() - t0
    head = probe.headroom()
    ok = [r for r in rows if not r.get("error")]
    cpu_us = (
        cpu_us_per_token(
            cpu, min(r["t_submit"] for r in ok), max(r["t_last_token"] for r in ok), sum(r["output_tokens"] for r in ok)
        )
        if ok
        else None
    )
    return lab_result(rows, srv, "lab", c, n, cpu_us, head, wall)


def lab_result(rows, srv, client: str, c: int, n: int, cpu_us_tok, head: dict, wall: float) -> dict:
    """A level's columns from the lab's rows: their stamps matched to the server's send times (its log, cleared)."""
    from lablib.results.tables import run_summary

    log = {r["rid"]: r for r in srv.sendlog(clear=True)}
    ok = [r for r in rows if not r.get("error")]
    pairs, matched = [], []
    for r in ok:
        m = TAG.match(r.get("text") or "")
        if m and int(m.group(1)) in log:
            pairs.append((lab_arrivals(r), log[int(m.group(1))]["t_send"]))
            matched.append(log[int(m.group(1))])
    s = run_summary(rows)
    out = compare(pairs, EDGE_STEPS * srv.itl_s)
    out.update(
        client=client,
        c=c,
        n=n,
        requests=len(rows),
        errors=s["errors"],
        exact=all(r.get("count_method") == "token_ids" and r.get("output_tokens") == n for r in ok),
        cpu_us_tok=cpu_us_tok,
        tok_s=s["output_tps"],
        server_tok_s=server_rate(matched),
        itl_p50_s=s["itl_p50_s"],
        itl_p99_s=s["itl_p99_s"],
        lag_p99_s=head.get("loop_lag_p99_s"),
        loop_cpu=head.get("loop_cpu_fraction"),
        near=head.get("near_limit"),
        wall_s=wall,
    )
    return out


def lab_procs_level(srv, c: int, n: int, max_s: float, manifest: dict | None, processes: int) -> dict:
    """:func:`lab_level` from ``processes`` client processes (:func:`lablib.measure.load.run_load_processes`:
    one start, one clock); ``lag_p99_s`` / ``near`` the worst process's, ``cpu_us_tok`` not measured (the
    sampler reads one process)."""
    from lablib.engines.base import GenerationConfig
    from lablib.measure.load import run_load_processes
    from lablib.measure.processes import merged_headroom

    srv.sendlog(clear=True)
    prompts = [[1000 + (i % 1000), 1 + i // 1000] + [7] * (PROMPT_TOKENS - 2) for i in range(2 * c)]
    cfg = GenerationConfig(max_new_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    rows, per = run_load_processes(
        {"model": None, "base_url": srv.base_url, "server": "vllm"},
        prompts,
        "closed",
        processes=processes,
        concurrency=c,
        cfg=cfg,
        max_duration_s=max_s,
        manifest=manifest,
    )
    wall = time.perf_counter() - t0
    return lab_result(rows, srv, f"lab-p{processes}", c, n, None, merged_headroom(per) or {}, wall)


def lab_rev_level(engine, srv, c: int, n: int, max_s: float, manifest: dict | None, rev: str) -> dict:
    """:func:`lab_level` with the engine's parse path (``SSEParser``, ``_StreamState``) as of git revision ``rev``."""
    import lablib.engines.http.engine as eng
    import lablib.engines.http.sse as sse

    parser, state = lab_modules(rev)
    saved = sse.SSEParser, eng._StreamState
    sse.SSEParser, eng._StreamState = parser, state  # agenerate imports SSEParser from sse at each call
    try:
        out = lab_level(engine, srv, c, n, max_s, manifest)
    finally:
        sse.SSEParser, eng._StreamState = saved
    out["client"] = f"lab@{rev}"
    return out


def vllm_level(anchor, python, srv, c: int, n: int, max_s: float, tokenizer: str, extra: dict, work: Path) -> dict:
    from vllm_anchor import anchor_argv

    srv.sendlog(clear=True)
    ns = SimpleNamespace(prompt_tokens=PROMPT_TOKENS, max_new_tokens=n, requests=2 * c, concurrency=c, seed=0)
    result = work / f"vllm-c{c}.json"
    argv = anchor_argv(
        python,
        root_url=srv.root_url,
        model_id="fast",
        tokenizer=tokenizer,
        ns=ns,
        result=result,
        extra=extra,
        backend="vllm",
    )
    t0 = time.perf_counter()
    with CpuSampler(anchor.proc.pid) as cpu:
        res = anchor.run(argv, max_s + 120)
    wall = time.perf_counter() - t0
    log = {r["rid"]: r for r in srv.sendlog(clear=True)}
    pairs, matched = [], []
    for i, text in enumerate(res.get("generated_texts") or []):
        m = TAG.match(text or "")
        if m and int(m.group(1)) in log and not res["errors"][i]:
            pairs.append((vllm_arrivals(res, i), log[int(m.group(1))]["t_send"]))
            matched.append(log[int(m.group(1))])  # its warm-up request left out
    out = compare(pairs, EDGE_STEPS * srv.itl_s)
    ok = [i for i, e in enumerate(res["errors"]) if not e]
    ends = [res["start_times"][i] + res["ttfts"][i] + sum(res["itls"][i]) for i in ok]
    ms = 1e-3
    out.update(
        client="vllm",
        c=c,
        n=n,
        requests=int(res["completed"]) + int(res.get("failed") or 0),
        errors=int(res.get("failed") or 0),
        exact=all(k == n for k in res.get("output_lens") or []),
        cpu_us_tok=cpu_us_per_token(
            cpu, min(res["start_times"][i] for i in ok), max(ends), sum(res["output_lens"][i] for i in ok)
        )
        if ok
        else None,
        tok_s=float(res["output_throughput"]),
        server_tok_s=server_rate(matched),
        itl_p50_s=res["median_itl_ms"] * ms,
        itl_p99_s=res["p99_itl_ms"] * ms,
        lag_p99_s=None,
        loop_cpu=None,
        near=None,
        wall_s=wall,
    )
    return out


# --- the parse section: each client's own read loop on the same bytes ------------------------------
def _loop_body(path: Path, func: str, iter_src: str) -> list[ast.stmt]:
    """The statements of the ``async for`` over ``iter_src`` in function ``func`` of ``path``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
            for sub in ast.walk(node):
                if isinstance(sub, ast.AsyncFor) and ast.unparse(sub.iter) == iter_src:
                    return sub.body
    raise SystemExit(f"no `async for ... in {iter_src}` in {func} of {path}: the parse section needs updating")


def _class_src(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ast.unparse(node)
    raise SystemExit(f"no class {name} in {path}")


def _make(var: str, body: list[ast.stmt], head: str, tail: str, ns: dict):
    """A function ``run(reads)``: ``head``, then ``for <var> in reads:`` the loop's own statements, then ``tail``."""
    loop = ast.For(
        target=ast.Name(id=var, ctx=ast.Store()),
        iter=ast.Name(id="reads", ctx=ast.Load()),
        body=body,
        orelse=[],
        lineno=1,
    )
    src = "def run(reads):\n" + textwrap.indent(head, "    ") + "\n" + textwrap.indent(ast.unparse(loop), "    ")
    src += "\n" + textwrap.indent(tail, "    ") + "\n"
    exec(compile(src, "<parse section>", "exec"), ns)
    return ns["run"]


_REV_CACHE: dict = {}


def lab_modules(rev: str | None):
    """(SSEParser, _StreamState) of the lab's parse path: the installed one, or ``sse.py`` and ``protocol.py``
    as of git revision ``rev`` (loaded beside it under other names)."""
    if rev in _REV_CACHE:
        return _REV_CACHE[rev]
    if rev is None:
        from lablib.engines.http.protocol import _StreamState
        from lablib.engines.http.sse import SSEParser

        return SSEParser, _StreamState
    import importlib.util
    import subprocess

    mods = {}
    for name in ("sse", "protocol"):
        src = subprocess.run(
            ["git", "-C", str(HERE.parent), "show", f"{rev}:lablib/engines/http/{name}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        path = Path(tempfile.mkdtemp(prefix="parse-rev-")) / f"{name}_at_rev.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"_lab_{name}_at_rev", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        mods[name] = mod
    _REV_CACHE[rev] = mods["sse"].SSEParser, mods["protocol"]._StreamState
    return _REV_CACHE[rev]


def lab_parser(n: int, rev: str | None = None):
    """The lab's read loop (HTTPEngine.agenerate's body of ``async for data in resp.content.iter_any()``), with
    the parse path of :func:`lab_modules`."""
    import lablib.engines.http.engine as eng
    from lablib.engines.http.trace import HTTPTrace

    SSEParser, _StreamState = lab_modules(rev)

    body = _loop_body(Path(eng.__file__), "agenerate", "resp.content.iter_any()")
    ns = dict(vars(eng))
    engine = SimpleNamespace(api="completions", _tok=None, read_timeout_s=60.0)
    ns.update(
        _StreamState=_StreamState,
        SSEParser=SSEParser,
        HTTPTrace=HTTPTrace,
        _engine=engine,
        _n=n,
        _SimpleNamespace=SimpleNamespace,
    )
    head = (
        "self, url = _engine, 'http://parse'\n"
        "trace = HTTPTrace(prompt_tokens=2, t_submit=0.0, max_new_tokens=_n)\n"
        "state = _StreamState(self, trace)\nparser = SSEParser()\nt_line, lines = now(), 0\n"
        "deadline = _SimpleNamespace(t_read=0.0)"  # the body's read deadline (_ReadDeadline): its t_read
    )
    tail = "state.finish()\nreturn trace.output_tokens, trace.count_method"
    return _make("data", body, head, tail, ns)


def vllm_parser(n: int, python: str | None):
    """vLLM's read loop (async_request_openai_completions's body of ``async for chunk_bytes in
    response.content.iter_any()``, with its StreamedResponseHandler), read from vLLM's environment."""
    import subprocess

    if python is None:
        return None
    where = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if where.returncode != 0:
        return None
    path = Path(where.stdout.strip()) / "benchmarks" / "lib" / "endpoint_request_func.py"
    body = _loop_body(path, "async_request_openai_completions", "response.content.iter_any()")
    import codecs

    ns = {"json": json, "time": time, "codecs": codecs}
    exec(_class_src(path, "StreamedResponseHandler"), ns)

    class Output:  # vLLM's RequestFuncOutput, the fields the loop sets
        def __init__(self):
            self.itl, self.ttft, self.output_tokens, self.prompt_len = [], 0.0, 0, 0

    ns["Output"] = Output
    head = (
        "output = Output()\nhandler = StreamedResponseHandler()\ngenerated_text = ''\n"
        "st = time.perf_counter()\nmost_recent_timestamp = st\nfirst_chunk_received = False"
    )
    tail = "return len(output.itl) + 1, output.output_tokens"
    return _make("chunk_bytes", body, head, tail, ns)


def parse_section(python: str | None, rounds: int, n: int = 2000, rev: str | None = None) -> list[str]:
    """Per-token CPU of each client's read loop on one stream's bytes, at 1, 16 and 256 events per read:
    the lab's, vLLM's (when its environment is there) and, with ``rev``, the lab's as of that git revision."""
    import gc

    fns = {"lab": lab_parser(n), "vllm": vllm_parser(n, python)}
    if rev:
        fns[f"lab@{rev}"] = lab_parser(n, rev)
    fns = {k: f for k, f in fns.items() if f is not None}
    payloads = stream_payloads(n, rid=1)
    lines = []
    for per in (1, 16, 256):
        reads = [b"".join(payloads[i : i + per]) for i in range(0, n, per)]
        for name, fn in fns.items():
            got = fn(reads)
            want = (n, n) if name == "vllm" else (n, "token_ids")
            assert got == want, f"{name}'s read loop counted {got}, expected {want}"
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(rounds):
            for name, fn in fns.items():
                gc.collect()
                t0 = time.thread_time()  # this thread's CPU time: other processes' use of the cores left out
                fn(reads)
                best[name] = min(best[name], time.thread_time() - t0)
        us = {k: v / n * 1e6 for k, v in best.items()}
        text = " ".join(f"{k}_us_per_token={v:.2f}" for k, v in us.items())
        for k in us:
            if k != "vllm" and "vllm" in us:
                text += f" ratio_{k}_over_vllm={us[k] / us['vllm']:.2f}"
        lines.append(f"parse events_per_read={per} {text}")
    return lines


# --- printing ---------------------------------------------------------------------------------------
COLS = (
    ("client", "client", "{}"),
    ("c", "C", "{}"),
    ("offered", "offered_tok_s", "{:.0f}"),
    ("server_tok_s", "server_tok_s", "{:.0f}"),
    ("tok_s", "tok_s", "{:.0f}"),
    ("cpu_us_tok", "cpu_us_tok", "{:.1f}"),
    ("added_itl_p50_s", "added_itl_p50_ms", "{:.3f}"),
    ("added_itl_p99_s", "added_itl_p99_ms", "{:.3f}"),
    ("added_itl_p99_edge_s", "edge_p99_ms", "{:.3f}"),
    ("added_itl_p99_mid_s", "mid_p99_ms", "{:.3f}"),
    ("delay_p50_s", "delay_p50_ms", "{:.2f}"),
    ("delay_p99_s", "delay_p99_ms", "{:.2f}"),
    ("itl_p50_s", "itl_p50_ms", "{:.3f}"),
    ("itl_p99_s", "itl_p99_ms", "{:.3f}"),
    ("lag_p99_s", "lag_p99_ms", "{:.2f}"),
    ("near", "near", "{}"),
    ("errors", "errors", "{}"),
    ("exact", "exact", "{}"),
    ("clock_ok", "clock_ok", "{}"),
    ("wall_s", "wall_s", "{:.1f}"),
)
MS = {key for key, head, _ in COLS if head.endswith("_ms")}  # seconds shown as ms


def cells(r: dict) -> list[str]:
    out = []
    for key, _, f in COLS:
        v = r.get(key)
        if v is None:
            out.append("-")
            continue
        out.append(f.format(v * 1e3 if key in MS else v))
    return out


def print_table(rows: list[dict]) -> None:
    table = [[h for _, h, _ in COLS]] + [cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLS))]
    for row in table:
        print("  ".join(x.rjust(w) for x, w in zip(row, widths)), flush=True)


def limits(rows: list[dict]) -> list[str]:
    """Per client: the levels within and past the added-ITL limit (p99 above :data:`ADDED_ITL_LIMIT_S`), the
    highest level at which it kept up with the server (its tokens/s at least :data:`KEEP_UP` of what the
    server sent) and its best tokens/s."""
    out = []
    for client in dict.fromkeys(r["client"] for r in rows):
        mine = [r for r in rows if r["client"] == client and r.get("added_itl_p99_s") is not None]
        if not mine:
            out.append(f"limit client={client} no levels")
            continue
        under = [r["c"] for r in mine if r["added_itl_p99_s"] <= ADDED_ITL_LIMIT_S]
        over = [r["c"] for r in mine if r["added_itl_p99_s"] > ADDED_ITL_LIMIT_S]
        kept = [r["c"] for r in mine if r.get("server_tok_s") and r["tok_s"] >= KEEP_UP * r["server_tok_s"]]
        best = max(mine, key=lambda r: r["tok_s"])
        out.append(
            f"limit client={client} added_itl_p99_limit_ms={ADDED_ITL_LIMIT_S * 1e3:g} "
            f"last_level_within={max(under) if under else None} first_level_over={min(over) if over else None} "
            f"kept_up_to_C={max(kept) if kept else None} max_tok_s={best['tok_s']:.0f}@C={best['c']}"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default=",".join(map(str, LEVELS_QUICK if QUICK else LEVELS)))
    ap.add_argument("--itl-s", type=float, default=0.01, help="the server's decode step")
    ap.add_argument("--level-s", type=float, default=1.0 if QUICK else 2.0, help="seconds per level (about)")
    ap.add_argument("--max-level-s", type=float, default=None, help="bound per level (default 10 x --level-s)")
    ap.add_argument(
        "--clients",
        default="lab,vllm",
        help="lab (pooled connections, as the lab's client talks to vLLM), lab-close (one connection per request, "
        "as to llama-server), lab-asyncio (the standard library's event loop, where the lab's is uvloop), lab-sockread "
        "(aiohttp's read timer re-armed at every read, as before the lab's own read deadline), lab-stdjson (chunks "
        "read with the standard library's JSON scanner, not orjson), lab-write (each row written to a .jsonl file "
        "as its request ends, as lablib bench --out does; lab-write-stdjson: without orjson; lab-write-fsync: each "
        "row fsync'd, as bench did before), vllm (vLLM's environment: lablib.build.vllm), lab@REV (the lab's parse path as of git REV), "
        "lab-pN (the lab's client from N processes on one clock: lablib.measure.processes)",
    )
    ap.add_argument("--server-cpus", default=None, help="CPUs the server runs on, e.g. 0 (Linux: sched_setaffinity)")
    ap.add_argument(
        "--client-cpus", default=None, help="CPUs this process, its client processes and vllm bench run on, e.g. 1"
    )
    ap.add_argument("--parse-rounds", type=int, default=3 if QUICK else 9)
    ap.add_argument("--parse-only", action="store_true", help="only the parse section")
    ap.add_argument("--no-parse", action="store_true", help="skip the parse section")
    ap.add_argument("--parse-rev", default=None, help="also time the lab's parse path as of this git revision")
    ap.add_argument("--profile", default=None, help="cProfile the lab's loop thread at --profile-level into FILE")
    ap.add_argument("--profile-level", type=int, default=256)
    ap.add_argument("--keep", default=None, help="folder for vllm bench's files and log (default: temporary)")
    ns = ap.parse_args(argv)
    levels = [int(x) for x in ns.levels.split(",") if x]
    clients = [c for c in ns.clients.split(",") if c]
    if not levels or min(levels) < 1 or max(levels) > 4096 or ns.itl_s <= 0 or ns.level_s <= 0:
        ap.error("expected --levels of 1..4096, a positive --itl-s and --level-s")
    max_s = ns.max_level_s or 10 * ns.level_s
    work = Path(ns.keep) if ns.keep else Path(tempfile.mkdtemp(prefix="client-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    cpus = lambda text: {int(x) for x in text.split(",")}  # noqa: E731
    if ns.client_cpus:  # before vllm bench's process and the client processes start: they inherit it
        os.sched_setaffinity(0, cpus(ns.client_cpus))
    print(f"# load average at start (1, 5, 15 min): {os.getloadavg()}; cpus: {os.cpu_count()}", flush=True)

    python = None
    if "vllm" in clients or not ns.no_parse:
        try:
            from lablib.build.vllm import python_path

            python = str(python_path())
        except Exception as e:  # noqa: BLE001 - vLLM's environment is optional here: its columns are left out
            print(f"# vLLM's environment is not usable ({e}); its client is left out", flush=True)
            clients = [c for c in clients if c != "vllm"]

    if not ns.no_parse:
        for ln in parse_section(python, ns.parse_rounds, rev=ns.parse_rev):
            print(ln, flush=True)
    if ns.parse_only:
        return 0

    from lablib.engines import load_engine

    anchor = tokenizer = None
    if "vllm" in clients:
        from vllm_anchor import Anchor

        from lablib.model.resolve import prepare

        tokenizer = prepare(log=lambda *_: None).path_for("hf", "vllm bench")
        t0 = time.perf_counter()
        anchor = Anchor(python, work / "vllm-bench.log")  # vLLM imported once, before any measurement
        print(f"# vllm bench ready in {time.perf_counter() - t0:.0f} s (log {work / 'vllm-bench.log'})", flush=True)
    rows: list[dict] = []
    try:
        with FastServer(itl_s=ns.itl_s) as srv:
            if ns.server_cpus:
                os.sched_setaffinity(srv.pid, cpus(ns.server_cpus))
            print(
                f"# cpus: server {sorted(os.sched_getaffinity(srv.pid))}, clients {sorted(os.sched_getaffinity(0))}",
                flush=True,
            )
            clock = srv.clock_check()
            print(
                f"# clock: client {clock['client_clock']}, server {clock['server_clock']}; client before {clock['before']:.6f} "
                f"<= server {clock['server']:.6f} <= client after {clock['after']:.6f}: {clock['ok']}",
                flush=True,
            )
            engine = load_engine("http", None, base_url=srv.base_url, server="vllm")  # pooled connections
            variants = {  # lab-close: one connection per request (as for llama-server); lab-asyncio: the
                # standard library's event loop where the lab's own (engine.event_loop "auto") is uvloop
                name: load_engine("http", None, base_url=srv.base_url, server="vllm", **kw)
                for name, kw in (("lab-close", {"keep_alive": False}), ("lab-asyncio", {"event_loop": "asyncio"}))
                if name in clients
            }
            print(f"# the lab's event loop: {engine.event_loop}", flush=True)
            from lablib.engines.base import GenerationConfig

            _, body, _ = engine._request([1000] * PROMPT_TOKENS, GenerationConfig(max_new_tokens=16, ignore_eos=True))
            extra = {k: v for k, v in body.items() if k not in ("model", "prompt", "max_tokens", "stream")}
            from lablib.results.store import engine_manifest

            manifest = engine_manifest(
                engine, {"benchmark": "client_capacity", "itl_s": ns.itl_s}
            )  # once, not per level
            print(f"# both clients' bodies: the lab's; vllm bench gets --extra-body {json.dumps(extra)}", flush=True)
            try:
                for k, c in enumerate(levels):
                    n = max(16, round(ns.level_s / 2 / ns.itl_s))
                    order = clients if k % 2 == 0 else clients[::-1]
                    for client in order:
                        if client == "lab":
                            r = lab_level(engine, srv, c, n, max_s, manifest)
                        elif client in ("lab-write", "lab-write-stdjson", "lab-write-fsync"):
                            with stdlib_json() if client.endswith("stdjson") else contextlib.nullcontext():
                                r = lab_level(
                                    engine,
                                    srv,
                                    c,
                                    n,
                                    max_s,
                                    manifest,
                                    work / f"{client}-{k}.jsonl",
                                    0.0 if client.endswith("fsync") else None,
                                )
                            r["client"] = client
                        elif client in AS_BEFORE:  # the lab's engine with one of its paths as it was
                            with AS_BEFORE[client]():
                                r = lab_level(engine, srv, c, n, max_s, manifest)
                            r["client"] = client
                        elif client in variants:
                            r = lab_level(variants[client], srv, c, n, max_s, manifest)
                            r["client"] = client
                        elif client == "lab@":
                            ap.error("lab@ needs a git revision: lab@REV")
                        elif client.startswith("lab-p") and client[5:].isdigit():
                            r = lab_procs_level(srv, c, n, max_s, manifest, int(client[5:]))
                        elif client.startswith("lab@"):
                            r = lab_rev_level(engine, srv, c, n, max_s, manifest, client.removeprefix("lab@"))
                        else:
                            r = vllm_level(anchor, python, srv, c, n, max_s, tokenizer, extra, work)
                        r["offered"] = c / ns.itl_s
                        rows.append(r)
                        print("# " + " ".join(f"{h}={v}" for (_, h, _), v in zip(COLS, cells(r))), flush=True)
                if ns.profile:
                    profile(engine, srv, ns.profile_level, max(16, round(ns.level_s / 2 / ns.itl_s)), max_s, ns.profile)
            finally:
                engine.close()
                for v in variants.values():
                    v.close()
    finally:
        if anchor is not None:
            anchor.close()
    print_table(rows)
    for ln in limits(rows):
        print(ln, flush=True)
    print(f"# whole benchmark {time.perf_counter() - t_all:.0f} s, load average now {os.getloadavg()}", flush=True)
    return 0


@contextlib.contextmanager
def aiohttp_read_timer():
    """The lab's client as it was before its own read deadline (``lablib.engines.http.engine._ReadDeadline``):
    aiohttp's ``sock_read`` timer left on through the body, cancelled and re-scheduled at every network read,
    and no timer of the lab's. For ``lab-sockread``, beside ``lab`` in one process and one run."""
    import lablib.engines.http.engine as http_engine

    class AiohttpTimer:
        __slots__ = ("t_read",)

        def __init__(self, resp, timeout_s: float):
            self.t_read = 0.0

        def cancel(self) -> None:
            pass

    own, http_engine._ReadDeadline = http_engine._ReadDeadline, AiohttpTimer
    try:
        yield
    finally:
        http_engine._ReadDeadline = own


@contextlib.contextmanager
def stdlib_json():
    """The lab's client reading each streamed chunk with the standard library's JSON scanner, and writing each row
    with ``json.dumps``, as without the serve extra's orjson (``lablib.engines.http.protocol.loads``,
    ``lablib.results.store.row_line``). For ``lab-stdjson`` and ``lab-write-stdjson``."""
    import lablib.engines.http.protocol as protocol
    import lablib.results.store as store

    own, protocol._fast = protocol._fast, None
    own_rows, store._orjson = store._orjson, False
    try:
        yield
    finally:
        protocol._fast, store._orjson = own, own_rows


AS_BEFORE = {"lab-sockread": aiohttp_read_timer, "lab-stdjson": stdlib_json}  # client -> its swap


def profile(engine, srv, c: int, n: int, max_s: float, out: str) -> None:
    """cProfile of the lab's loop thread (where the streams are read and parsed) during one level."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()

    async def on():
        prof.enable()

    async def off():
        prof.disable()

    engine.run(on())
    try:
        lab_level(engine, srv, c, n, max_s)
    finally:
        engine.run(off())
    prof.dump_stats(out)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(f"# profile of the lab's loop thread at C={c} ({out}):", flush=True)
    for ln in s.getvalue().splitlines():
        print("# " + ln, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
