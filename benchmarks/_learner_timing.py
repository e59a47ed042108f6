"""Timing for the learner-feed benchmark (shared by its shmreplay and Reverb sides): each
case's train steps per second and CPU per step, the cases alternating round by round.
"""

import time

# Untimed steps before each timed span: a fed case's prefetched batches, filled while
# other cases ran, would otherwise give its span a head start (a few steps of a span
# of a few hundred) when its feed is slower than the step.
LEAD_STEPS = 12


def run_for(seconds, step, finish=lambda: None, lead=0):
    """``(steps/s, CPU seconds per step)`` of ``step()`` run for about ``seconds``, after
    ``lead`` untimed steps; ``finish()`` waits for the work still in flight (JAX's
    asynchronous dispatch) inside the timed span. CPU time is the whole process's
    (every thread)."""
    for _ in range(lead):
        step()
    finish()
    perf = time.perf_counter
    cpu0 = time.process_time()
    t0 = perf()
    end = t0 + seconds
    n = 0
    while perf() < end:
        step()
        n += 1
    finish()
    return n / (perf() - t0), (time.process_time() - cpu0) / n


def alternate(cases, rounds, seconds, warmup):
    """``({label: [steps/s per round]}, {label: [CPU s per step per round]})``, every
    case once per round, the order flipping every round, so that load that comes and
    goes on the machine hits the cases of a round alike."""
    for step, finish in cases.values():
        run_for(warmup, step, finish)
    rates = {label: [] for label in cases}
    cpu = {label: [] for label in cases}
    order = list(cases)
    for r in range(rounds):
        for label in (order if r % 2 == 0 else order[::-1]):
            rate, cpu_per_step = run_for(seconds, *cases[label], lead=LEAD_STEPS)
            rates[label].append(rate)
            cpu[label].append(cpu_per_step)
    return rates, cpu
