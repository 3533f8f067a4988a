//! The modules (executable and shared objects) loaded in this process, and
//! which of them may be instrumented.

use rtprof_abi::layout::ModuleWhy;
use std::ffi::CStr;

#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub vaddr: u64,
    pub memsz: u64,
    /// Where the segment's bytes are in the file, and how many of them.
    pub offset: u64,
    pub filesz: u64,
    pub flags: u32,
}

impl Load {
    pub fn executable(&self) -> bool {
        self.flags & libc::PF_X != 0
    }
    pub fn readable(&self) -> bool {
        self.flags & libc::PF_R != 0
    }
}

#[derive(Debug, Clone)]
pub struct Module {
    /// Path as the loader knows it (the main executable's resolved path).
    pub path: String,
    /// File to read the ELF from.
    pub file: String,
    /// Load bias: runtime address = bias + ELF virtual address.
    pub bias: u64,
    pub loads: Vec<Load>,
    pub is_main: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    Agent,
    Loader,
    Vdso,
    NotSelected,
}

impl Skip {
    /// What a report says of a module skipped for this reason.
    pub fn why(self) -> ModuleWhy {
        match self {
            Skip::Agent => ModuleWhy::OwnCode,
            Skip::Loader => ModuleWhy::Loader,
            Skip::Vdso => ModuleWhy::Vdso,
            Skip::NotSelected => ModuleWhy::None,
        }
    }
}

impl Module {
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// Lowest and highest runtime address covered by the module's segments.
    pub fn span(&self) -> (u64, u64) {
        let lo = self.loads.iter().map(|l| l.vaddr).min().unwrap_or(0);
        let hi = self
            .loads
            .iter()
            .map(|l| l.vaddr + l.memsz)
            .max()
            .unwrap_or(0);
        (self.bias.wrapping_add(lo), self.bias.wrapping_add(hi))
    }

    /// The segment containing runtime range [addr, addr+len), if any.
    pub fn load_containing(&self, addr: u64, len: u64) -> Option<&Load> {
        let v = addr.wrapping_sub(self.bias);
        self.loads
            .iter()
            .find(|l| v >= l.vaddr && v.checked_add(len).is_some_and(|e| e <= l.vaddr + l.memsz))
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.load_containing(addr, 1).is_some()
    }
}

unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `&mut Vec<Module>` that `loaded` passed to
    // dl_iterate_phdr, which calls back on its own thread while it is live.
    let out = &mut *(data as *mut Vec<Module>);
    // SAFETY: the loader passes a valid entry for the call's duration.
    let info = &*info;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        CStr::from_ptr(info.dlpi_name)
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: the module's program headers, `dlpi_phnum` of them, mapped
    // with it.
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
    let loads = phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD)
        .map(|p| Load {
            vaddr: p.p_vaddr,
            memsz: p.p_memsz,
            offset: p.p_offset,
            filesz: p.p_filesz,
            flags: p.p_flags,
        })
        .collect();
    let is_main = out.is_empty();
    let (path, file) = if is_main {
        let exe = std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| name.clone());
        (exe, "/proc/self/exe".to_string())
    } else {
        (name.clone(), name)
    };
    out.push(Module {
        path,
        file,
        bias: info.dlpi_addr,
        loads,
        is_main,
    });
    0
}

/// Every module the dynamic loader reports; the main executable first.
pub fn loaded() -> Vec<Module> {
    let mut v: Vec<Module> = Vec::new();
    // SAFETY: `collect` has the callback's signature and casts the data
    // pointer back to this `Vec<Module>`, live for the whole call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(collect),
            &mut v as *mut Vec<Module> as *mut libc::c_void,
        )
    };
    v
}

fn agent_base() -> u64 {
    // SAFETY: `Dl_info` is pointers and integers: all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = agent_base as *const () as *const libc::c_void;
    // SAFETY: `here` is an address in our own code; `info` is a live local
    // that dladdr fills.
    if unsafe { libc::dladdr(here, &mut info) } != 0 {
        info.dli_fbase as u64
    } else {
        0
    }
}

/// Why `m` must not be instrumented, if it must not.
pub fn skip_reason(m: &Module, selects: &dyn Fn(&str) -> bool) -> Option<Skip> {
    let (lo, _) = m.span();
    // SAFETY: getauxval takes a key and reads the process's own auxiliary
    // vector (0 if the entry is missing).
    let ld_base = unsafe { libc::getauxval(libc::AT_BASE) };
    // SAFETY: as above.
    let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if m.contains(agent_base()) || m.bias == agent_base() {
        Some(Skip::Agent)
    } else if (ld_base != 0 && m.bias == ld_base) || m.name().starts_with("ld-linux") {
        Some(Skip::Loader)
    } else if (vdso != 0 && lo == vdso) || m.name().starts_with("linux-vdso") || m.path.is_empty() {
        Some(Skip::Vdso)
    } else if !m.is_main && !selects(m.name()) {
        Some(Skip::NotSelected)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_main_and_libc_and_skips_the_right_ones() {
        let mods = loaded();
        assert!(mods[0].is_main);
        assert!(mods[0].loads.iter().any(|l| l.executable()));
        let all = |_: &str| true;
        let libc = mods
            .iter()
            .find(|m| m.name().starts_with("libc.so"))
            .expect("libc loaded");
        assert_eq!(skip_reason(libc, &all), None);
        assert_eq!(skip_reason(libc, &|_| false), Some(Skip::NotSelected));
        // In the unit-test binary the agent code lives in the main executable.
        assert_eq!(skip_reason(&mods[0], &|_| false), Some(Skip::Agent));
        let ld = mods
            .iter()
            .find(|m| m.name().starts_with("ld-linux"))
            .expect("loader");
        assert_eq!(skip_reason(ld, &all), Some(Skip::Loader));
        if let Some(v) = mods.iter().find(|m| m.name().starts_with("linux-vdso")) {
            assert_eq!(skip_reason(v, &all), Some(Skip::Vdso));
        }
    }
}
