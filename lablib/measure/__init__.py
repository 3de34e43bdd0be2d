"""Drivers: prompts in, traces out, rows written.

- :mod:`lablib.measure.workload`: prompts of an exact token length from real text, chat ids;
- :mod:`lablib.measure.closed_loop`: C clients in process, serial or batched (``SCHEDULING_MODES``);
- :mod:`lablib.measure.load`: over HTTP, closed or open loop, arrival schedules, rate sweeps (``LOAD_SHAPES``);
- :mod:`lablib.measure.plan`: a measurement's parameters checked before anything loads (the guards);
- :mod:`lablib.measure.sweep`: one request measured with warm-up and repetitions, side by side,
  the one loop of a sweep (``run_plan``), the context and concurrency sweeps as plans.
"""
