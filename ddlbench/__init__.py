"""ddl-benchmarks: the communication side of data-parallel synchronous SGD, measured."""

__version__ = "0.1.0"
