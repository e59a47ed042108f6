"""Timing for the learner-feed benchmark (shared by its shmreplay and Reverb sides): each
case's train steps per second and CPU per step, the cases alternating round by round.
"""

import time


def run_for(seconds, step, finish=lambda: None):
    """``(steps/s, CPU seconds per step)`` of ``step()`` run for about ``seconds``;
    ``finish()`` waits for the work still in flight (JAX's asynchronous dispatch)
    inside the timed span. CPU time is the whole process's (every thread)."""
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
            rate, cpu_per_step = run_for(seconds, *cases[label])
            rates[label].append(rate)
            cpu[label].append(cpu_per_step)
    return rates, cpu
