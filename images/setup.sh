#!/bin/sh
# Finishes berth's sandbox image. Runs as root inside the freshly bootstrapped
# Debian root filesystem (chroot), before it is packed and imported.
set -eu

# The unprivileged user every sandbox process runs as (uid:gid 1000:1000).
groupadd --gid 1000 berth
useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash berth

# A copy of bash its users may run but not read. berth runs a session's shell
# from it: the kernel leaves a process that executes a file it cannot read
# non-dumpable, so the programs a command starts (dumpable, as any other)
# cannot read the shell's memory or open its descriptors through /proc, where
# they would find what ends a command's report before the command has ended.
install -d -m 0755 /usr/local/libexec/berth
install -m 0711 -o root -g root /bin/bash /usr/local/libexec/berth/bash

# Mount points of the sandbox's volumes. A new named volume copies the
# ownership of the directory it is mounted over, so these decide who owns the
# workspace and berth's private state.
mkdir -p /workspace /var/lib/berth /run/sshd
chown berth:berth /workspace /var/lib/berth
chmod 0755 /workspace /var/lib/berth

# No SSH host keys are baked in: every container that runs sshd must make its
# own (`ssh-keygen -A`), or all sandboxes would share one identity.
rm -f /etc/ssh/ssh_host_*

# Slim the image: package lists, caches, docs and translations.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old \
  /var/log/*.log /var/log/apt/* /usr/share/doc/* /usr/share/man/* /usr/share/info/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
