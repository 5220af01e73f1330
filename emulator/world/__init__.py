"""The virtual world of a job: the mesh (ranks, axes, groups, classes of ranks), the virtual
process group that stands for every rank not run, the fake collectives torch's functional
API reaches, and the communication events all of them record.

Modules: `mesh`, `virtual_pg`, `fake_collectives`, `comm_events`.
"""
