"""The notebook proxy: browsers' way to the notebook servers of ``colony jupyter`` jobs
(:mod:`jobs.notebook_proxy.server`), through the nodes' tunnels (:mod:`jobs.notebook_proxy.tunnel`)."""
