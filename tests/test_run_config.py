"""The run's typed configuration (ddlbench.run_config.RunConfig): built once from the checked
flags, immutable, and naming in the record exactly the settings the namespace named."""
import dataclasses

import pytest

from ddlbench import flags, train
from ddlbench.run_config import RunConfig

# The settings every record of these command lines named when it was built from the flags'
# namespace (``vars(args)`` less output and given), written out as that code gave them.
DEFAULTS = {
    "atol": None, "backend": "auto", "batch_size": 64, "bucket_cap_mb": 25.0,
    "compressor": "none", "credit": 16000000, "density": 0.001, "dtype": "float32",
    "engine": "torch", "image_size": None, "job_id": None, "lr": None, "method": "ddp",
    "mgwfbp_ab": "measured", "mgwfbp_comm_iters": 10, "mgwfbp_iters": 50,
    "mgwfbp_min_group": 8192, "mgwfbp_profile": None, "mgwfbp_warmup": 5, "model": "resnet50",
    "one_machine": True, "ps_force_servers": False, "ps_local": False,
    "momentum": None, "net": "loopback", "network": "local", "no_cuda": False, "no_pin": False,
    "nservers": 0, "nservers_given": False, "num_batches_per_iter": 10, "num_classes": 1000,
    "num_iters": 10, "num_warmup_batches": 10, "nworkers": None, "optimizer": "auto",
    "partition": 4000000, "partition_bytes": 4096000, "powersgd_dense_steps": 0,
    "powersgd_rank": 4, "ps_clients": "machine", "rtol": None, "save_params": None, "seed": 42,
    "sentence_len": 64, "server_schedule": "1", "slots": None, "threads": None,
    "threshold": None, "timeline": None, "timeline_iters": None, "timeout": 300.0,
    "trace_collectives": None, "verify": 0, "vocab_size": None, "weight_decay": 0.0,
    # the options of today's methods (zero and hsdp, fsdp2, localsgd and diloco)
    "gather_prefetch": "1", "outer_lr": 0.7, "outer_momentum": 0.9, "period": 4,
    "reshard_after_forward": "0", "rs_carrier": "auto", "ag_carrier": "auto", "zero_stage": "2",
    # the PS methods' placement and byteschedulerps's server rule and summing threads
    "ps_placement": "least-loaded", "server_rule": "fewest-pushes", "engine_threads": 8,
    # the original's launchers set torch.backends.cudnn.benchmark (issue 60)
    "cudnn_benchmark": False,
}

SEVERAL = ["--model", "resnet18", "--batch-size", "8", "--method", "fusion,ddp", "--nworkers",
           "2", "--no-cuda", "--output", "/tmp/x/{method}.json", "--timeline",
           "/tmp/x/{method}.trace.json", "--threshold", "1000", "--num-iters", "3"]
SEVERAL_RECORD = {**DEFAULTS, "model": "resnet18", "batch_size": 8, "method": "fusion,ddp",
                  "nworkers": 2, "no_cuda": True, "timeline": "/tmp/x/{method}.trace.json",
                  "threshold": 1000.0, "num_iters": 3}
VERIFY = ["--model", "bert_tiny", "--method", "bytescheduler", "--no-cuda", "--verify", "2",
          "--rtol", "0.001", "--compressor", "fp16,topk", "--nworkers", "1"]
VERIFY_RECORD = {**DEFAULTS, "model": "bert_tiny", "method": "bytescheduler", "no_cuda": True,
                 "verify": 2, "rtol": 0.001, "compressor": "fp16,topk", "nworkers": 1}


def config_of(argv) -> RunConfig:
    args = flags.parse_args(argv)
    flags.check(args)
    return RunConfig.of(args)


@pytest.mark.parametrize("argv,expected", [(SEVERAL, SEVERAL_RECORD), (VERIFY, VERIFY_RECORD)],
                         ids=["several", "verify"])
def test_the_record_names_what_the_namespace_named(argv, expected):
    assert config_of(argv).record() == expected


def test_each_method_of_a_job_has_its_own_paths_and_the_job_in_its_record():
    config = config_of(SEVERAL)
    assert config.method_ids == ["fusion", "ddp"]
    one = config.for_method("ddp", 1)
    assert one.record() == {**SEVERAL_RECORD, "method": "ddp",
                            "timeline": "/tmp/x/ddp.trace.json",
                            "job": {"methods": ["fusion", "ddp"], "index": 1}}
    assert (one.method, one.output, one.timeline) == ("ddp", "/tmp/x/ddp.json",
                                                      "/tmp/x/ddp.trace.json")
    assert one.runs == (("ddp", "none"),)
    assert config.record() == SEVERAL_RECORD  # the job's own is untouched
    single = config_of(VERIFY)
    assert single.for_method("bytescheduler", 0) is single


def test_the_typed_parts_are_built_from_the_flags():
    config = config_of(SEVERAL)
    assert config.job.use_cuda is False and config.job.nservers == 0
    assert config.job.horovod is None
    assert (config.spec.model, config.spec.batch_size) == ("resnet18", 8)
    assert config.optimizer.flag == "auto" and config.optimizer.model == "resnet18"
    assert config.options["fusion"].threshold == 1000.0
    assert config.options["ddp"].bucket_cap_mb == 25.0
    assert (config.warmup, config.batches_per_iter, config.iters) == (10, 10, 3)
    verify = config_of(VERIFY)
    assert verify.runs == (("bytescheduler", "fp16"), ("bytescheduler", "topk"))
    assert (verify.verify, verify.rtol, verify.atol) == (2, 0.001, None)
    assert verify.compressor_options["density"] == 0.001


def test_it_is_immutable():
    config = config_of(SEVERAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.verify = 3
    for mapping in (config.recorded, config.options, config.compressor_options):
        with pytest.raises(TypeError):
            mapping["method"] = "ddp"
    record = config.record()  # a copy: changing it changes nothing
    record["method"] = "wfbp"
    config.record()["timeline"] = None
    assert config.record() == SEVERAL_RECORD


def test_the_training_script_keeps_its_entry_points():
    assert train.parse_args is flags.parse_args and train.check is flags.check
    assert callable(train.worker) and callable(train.benchmark) and callable(train.main)
