"""The agent's metrics and job control against a real Redis: a NodeSample per interval, samples kept
through an outage, registrations with topology and running jobs, simulated OOM kills, and the
duty-cycle / suspend / resume commands."""

from __future__ import annotations

import signal

import psutil
import redis as redis_lib

from agents import agent as agent_module
from agents import protocol
from cluster_ui.devstack.redis_server import PrivateRedis

from .helpers import command, events, launch, python, samples, send, status, stop, wait_for

SLEEPER = "import time; print('working', flush=True); time.sleep(60)"
BURN = "print('burning', flush=True)\nwhile True: pass"


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def started(client, job_id):
    return [e for e in events(client, "job_started") if e.job_id == job_id]


def test_a_node_sample_reaches_the_metrics_stream_every_interval(redis_url, redis_client, start_agent):
    start_agent(redis_url, interval=0.1)
    cmd = launch(python(SLEEPER), gpus=[1], env={"COLONY_SIM_WORKLOAD": "idle:mem=3000,ramp=0"})
    send(redis_client, "n1", cmd)

    def with_job():
        return [s for s in samples(redis_client) if s.running_jobs == [cmd.job_id] and s.jobs]

    wait_for(with_job)
    wait_for(lambda: len(samples(redis_client)) >= 10)
    seen = samples(redis_client)
    assert [s.seq for s in seen] == list(range(len(seen)))  # counts up from 0, no gaps
    assert all(s.node == "n1" for s in seen)
    stamps = [s.ts for s in seen]
    assert stamps == sorted(stamps)
    rate = (len(seen) - 1) / (stamps[-1] - stamps[0])
    assert 5 < rate < 12  # ~10 per second at interval 0.1
    latest = with_job()[-1]
    assert latest.jobs == [protocol.JobGpuSample(job_id=cmd.job_id, gpu_index=1, mem_used_mib=3000, util_sm=0.0)]
    assert [g.mem_used_mib for g in latest.gpus] == [0, 3000]
    assert [g.mem_total_mib for g in latest.gpus] == [15360, 15360]
    assert seen[0].running_jobs == []  # the first sample came before the launch

    send(redis_client, "n1", stop(cmd.job_id, grace=2))
    wait_for(lambda: exited(redis_client, cmd.job_id))
    wait_for(lambda: samples(redis_client)[-1].running_jobs == [] and samples(redis_client)[-1].jobs == [])


def test_samples_taken_while_redis_is_down_arrive_in_order_after_reconnect(tmp_path, start_agent, monkeypatch):
    monkeypatch.setattr(agent_module, "BACKOFF_MAX", 0.4)  # reconnect promptly once it is back
    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        running = start_agent(server.url, spec="4xA100-80GB", interval=0.1, sample_buffer=5)
        agent = running.agent
        cmd = launch(python(SLEEPER), gpus=[0])
        send(client, "n1", cmd)
        wait_for(lambda: started(client, cmd.job_id))
        [first_registration] = events(client, "node_registered")
        assert first_registration.running_jobs == []
        assert len(first_registration.topology) == 6
        assert {link.kind for link in first_registration.topology} == {"nvlink"}
        client.close()
        port = server.port
        server.stop()

        wait_for(lambda: agent.buffered_samples)
        first_buffered = agent.buffered_samples[0]
        wait_for(lambda: agent.dropped_samples >= 3, timeout=5)  # the window is bounded
        assert len(agent.buffered_samples) == 5

        with PrivateRedis(tmp_path / "redis", port=port) as server:
            client = redis_lib.Redis.from_url(server.url)
            wait_for(lambda: len(samples(client)) >= 8, timeout=8)
            seqs = [s.seq for s in samples(client)]
            # The oldest samples of the outage were dropped; from there on, nothing is missing.
            assert seqs[0] == first_buffered + agent.dropped_samples
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert all(s.running_jobs == [cmd.job_id] for s in samples(client))
            [registration] = events(client, "node_registered")
            assert registration.running_jobs == [cmd.job_id]  # so the server can reconcile
            assert len(registration.topology) == 6
            running.stop()
            client.close()


def test_a_job_that_overflows_its_simulated_gpu_is_killed_and_reported_oom(redis_url, redis_client, start_agent):
    start_agent(redis_url, spec="1xT4-16GB", interval=0.1)
    resident = launch(python(SLEEPER), gpus=[0], env={"COLONY_SIM_WORKLOAD": "idle:mem=9000,ramp=0"})
    grower = launch(python(SLEEPER), gpus=[0], env={"COLONY_SIM_WORKLOAD": "mem=8000,ramp=0.5,period=1"})
    send(redis_client, "n1", resident)
    wait_for(lambda: started(redis_client, resident.job_id))
    send(redis_client, "n1", grower)
    [done] = wait_for(lambda: exited(redis_client, grower.job_id), timeout=8)
    assert done.oom is True and done.stopped is False
    assert done.exit_code == -signal.SIGKILL
    assert done.error.startswith("CUDA out of memory (simulated) on GPU 0: job %d needs" % grower.job_id)
    assert done.output_tail == "working\n"
    # The resident job was not touched, and its memory is all that is left on the GPU.
    wait_for(lambda: samples(redis_client)[-1].running_jobs == [resident.job_id])
    latest = samples(redis_client)[-1]
    assert [(j.job_id, j.mem_used_mib) for j in latest.jobs] == [(resident.job_id, 9000)]
    assert exited(redis_client, resident.job_id) == []


def test_duty_cycle_suspend_and_resume_commands_are_applied_once_each(redis_url, redis_client, start_agent):
    running = start_agent(redis_url)
    runner = running.agent.runner
    cmd = launch(python(BURN), duty_cycle=0.5)  # starts throttled
    send(redis_client, "n1", cmd)
    [job] = wait_for(lambda: started(redis_client, cmd.job_id))
    assert runner.duty_cycle(cmd.job_id) == 0.5

    suspend = command(protocol.SuspendJob, cmd.job_id)
    send(redis_client, "n1", suspend)
    wait_for(lambda: runner.duty_cycle(cmd.job_id) == 0.0)
    wait_for(lambda: status(job.pid) == psutil.STATUS_STOPPED)
    send(redis_client, "n1", command(protocol.ResumeJob, cmd.job_id))
    wait_for(lambda: runner.duty_cycle(cmd.job_id) == 0.5)  # the duty cycle it had before

    send(redis_client, "n1", suspend)  # delivered again: already applied, so ignored
    send(redis_client, "n1", command(protocol.SetDutyCycle, 999, duty_cycle=0.5))  # not here: ignored
    send(redis_client, "n1", command(protocol.SetDutyCycle, cmd.job_id, duty_cycle=0.25))
    wait_for(lambda: runner.duty_cycle(cmd.job_id) == 0.25)  # applied in order: not suspended

    # Cancelling a suspended job still ends it.
    send(redis_client, "n1", command(protocol.SuspendJob, cmd.job_id))
    wait_for(lambda: status(job.pid) == psutil.STATUS_STOPPED and runner.duty_cycle(cmd.job_id) == 0.0)
    send(redis_client, "n1", stop(cmd.job_id, grace=10))
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=5)
    assert done.stopped and done.exit_code == -signal.SIGTERM and not done.oom
    stream = protocol.command_stream("n1")
    assert redis_client.xpending(stream, protocol.AGENT_COMMAND_GROUP)["pending"] == 0
    assert redis_client.xlen(protocol.DEAD_LETTER_STREAM) == 0


def test_samples_say_the_duty_cycle_each_running_job_runs_at(redis_url, redis_client, start_agent):
    """What the control plane compares with the duty cycles it stored, to send again one that did
    not arrive (``node_health.reconcile_duty_cycles``): 0 while suspended."""
    start_agent(redis_url, interval=0.1)
    cmd = launch(python(SLEEPER), gpus=[0])
    send(redis_client, "n1", cmd)
    wait_for(lambda: [s for s in samples(redis_client) if s.running_jobs == [cmd.job_id]])
    assert [s for s in samples(redis_client) if s.running_jobs][-1].duty_cycles == [1.0]
    send(redis_client, "n1", command(protocol.SetDutyCycle, cmd.job_id, duty_cycle=0.5))
    wait_for(lambda: samples(redis_client)[-1].duty_cycles == [0.5])
    send(redis_client, "n1", command(protocol.SuspendJob, cmd.job_id))
    wait_for(lambda: samples(redis_client)[-1].duty_cycles == [0.0])
    send(redis_client, "n1", stop(cmd.job_id, grace=1))
    wait_for(lambda: samples(redis_client)[-1].running_jobs == [] and samples(redis_client)[-1].duty_cycles == [])
