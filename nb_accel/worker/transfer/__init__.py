"""How objects travel between the kernel and the workers: pickled with cloudpickle, code keeping
its file names (:mod:`.code_files`), big buffers (tensor storages, NumPy arrays) written once
into a shared-memory segment (:mod:`.segments`) and mapped by every process that loads them
(:mod:`.pickling`)."""
