"""rbrules: the rules the compiler and the kit share, each written once (stdlib only, Python >=
3.9).

The bottom of the kit: it imports nothing outside itself; rbprobes and rbkit import it, and it is
the one host-side package the compiler imports (for the rules it renders into a runbook's bash).

    launch    how every Python the runbook starts on a host is started: isolated, by the path of
              the kit's own entry file, from a private working directory
    cpus      how many CPUs this process may use (affinity, the cgroup's quota): one count for
              every place that sizes jobs or streams
    compression  the compression table, the words auto may choose, which a host has
    streams   tar's record; how many streams and walkers; what the model counts a stream's ends
    linkrate  compression auto's measurement of the link
    enginerules  the engine's steps, the prove timeout, the lock's wait
    choices   the install engine's choices (the schema the compiler emits through)
    units     a byte count in words (`human`)
    links     whether a symbolic link leads outside the venv (the transfer's scan, the `outside`
              check)
    paths     the names a run keeps beside a destination: staging, lock, env file
    private   whether a path root executes from or writes to is private, and the refusal if not
    proven    ours means proven, never placed: whether a file or directory found beside or inside
              a destination is ours (owner, who may write it, one link), a directory made so, a
              record a run wrote earlier (a saved plan, its scan and state) read back so
    sshfiles  the files ssh reads for a host (its -F config, the known_hosts files ssh -G names),
              judged before ssh uses them
    shown     how a name is shown to a person: escaped as `ls -b` / repr would, never raw
"""
