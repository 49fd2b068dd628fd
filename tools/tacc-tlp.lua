-- tacc TLP capture: a Wireshark / tshark dissector (Lua 5.2, Wireshark >= 3.6).
--
-- Decodes the pcapng files `tacc pcie capture` writes: link-layer type
-- LINKTYPE_USER0 (147, DLT_USER0), each packet one 64-byte struct tacc_tlp_rec
-- (kernel/include/tacc_hw.h, docs/capture-format.md "TLP capture (pcapng)").
--
--   tshark -X lua_script:tools/tacc-tlp.lua -r copy.pcapng
--   tshark -X lua_script:tools/tacc-tlp.lua -r copy.pcapng -Y 'tacc_tlp.kind == 2' \
--          -T fields -e tacc_tlp.tag -e tacc_tlp.payload
--   wireshark -X lua_script:tools/tacc-tlp.lua copy.pcapng
--
-- (Wireshark does not run Lua scripts given with -X as root by default: run it as a
-- normal user.)

local p = Proto("tacc_tlp", "tacc TLP capture")

local kinds = { [0] = "MRd", [1] = "MWr", [2] = "CplD" }
local fmt_types = { [0x20] = "MRd (4DW)", [0x60] = "MWr (4DW)", [0x4a] = "CplD (3DW)" }

local f = p.fields
f.t_ps = ProtoField.uint64("tacc_tlp.t_ps", "Time at the link model (ps)", base.DEC)
f.addr = ProtoField.uint64("tacc_tlp.addr", "Address", base.HEX)
f.cmd_tag = ProtoField.uint64("tacc_tlp.cmd_tag", "Command user tag", base.HEX)
f.seq = ProtoField.uint32("tacc_tlp.seq", "Capture sequence", base.DEC)
f.payload = ProtoField.uint16("tacc_tlp.payload", "Payload bytes (MRd: requested)", base.DEC)
f.link_bytes = ProtoField.uint16("tacc_tlp.link_bytes", "Link bytes", base.DEC)
f.req_id = ProtoField.uint16("tacc_tlp.req_id", "Requester ID", base.HEX)
f.cpl_id = ProtoField.uint16("tacc_tlp.cpl_id", "Completer ID", base.HEX)
f.tag = ProtoField.uint16("tacc_tlp.tag", "Tag", base.DEC)
f.len_dw = ProtoField.uint16("tacc_tlp.length", "Length (DW)", base.DEC)
f.byte_count = ProtoField.uint16("tacc_tlp.byte_count", "Byte count", base.DEC)
f.fmt_type = ProtoField.uint8("tacc_tlp.fmt_type", "Fmt/Type", base.HEX, fmt_types)
f.kind = ProtoField.uint8("tacc_tlp.kind", "Kind", base.DEC, kinds)
f.flags = ProtoField.uint8("tacc_tlp.flags", "Flags", base.HEX)
f.up = ProtoField.bool("tacc_tlp.up", "Upstream (device to host)", 8, nil, 0x01)
f.ctrl = ProtoField.bool("tacc_tlp.ctrl", "Control traffic", 8, nil, 0x02)
f.first_be = ProtoField.uint8("tacc_tlp.first_be", "First DW BE", base.HEX, nil, 0x0f)
f.last_be = ProtoField.uint8("tacc_tlp.last_be", "Last DW BE", base.HEX, nil, 0xf0)
f.lower_addr = ProtoField.uint8("tacc_tlp.lower_addr", "Lower address", base.HEX)
f.func = ProtoField.uint8("tacc_tlp.func", "Function (0 = PF)", base.DEC)
f.version = ProtoField.uint8("tacc_tlp.version", "Record version", base.DEC)
f.queue = ProtoField.uint8("tacc_tlp.queue", "Queue (255: none)", base.DEC)
f.ctx = ProtoField.uint16("tacc_tlp.ctx", "Context", base.DEC)
f.job = ProtoField.uint32("tacc_tlp.job", "Job", base.DEC)

function p.dissector(buf, pinfo, tree)
    if buf:len() < 64 then
        return 0
    end
    pinfo.cols.protocol = "TACC-TLP"
    local t = tree:add(p, buf(0, 64))
    local kind = buf(43, 1):uint()
    local flags = buf(44, 1):uint()
    t:add_le(f.t_ps, buf(0, 8))
    t:add_le(f.kind, buf(43, 1))
    t:add(f.fmt_type, buf(42, 1))
    local fl = t:add(f.flags, buf(44, 1))
    fl:add(f.up, buf(44, 1))
    fl:add(f.ctrl, buf(44, 1))
    t:add_le(f.addr, buf(8, 8))
    t:add_le(f.len_dw, buf(38, 2))
    t:add_le(f.payload, buf(28, 2))
    t:add_le(f.link_bytes, buf(30, 2))
    t:add_le(f.req_id, buf(32, 2))
    if kind ~= 1 then
        t:add_le(f.tag, buf(36, 2))
    end
    if kind == 2 then
        t:add_le(f.cpl_id, buf(34, 2))
        t:add_le(f.byte_count, buf(40, 2))
        t:add(f.lower_addr, buf(46, 1))
    else
        t:add(f.first_be, buf(45, 1))
        t:add(f.last_be, buf(45, 1))
    end
    t:add(f.func, buf(47, 1))
    t:add_le(f.seq, buf(24, 4))
    t:add_le(f.cmd_tag, buf(16, 8))
    t:add_le(f.job, buf(52, 4))
    t:add_le(f.ctx, buf(50, 2))
    t:add(f.queue, buf(49, 1))
    t:add(f.version, buf(48, 1))
    local dir = (flags % 2 == 1) and "up" or "down"
    local ctrl = (math.floor(flags / 2) % 2 == 1) and " ctrl" or ""
    pinfo.cols.src = (flags % 2 == 1) and "device" or "host"
    pinfo.cols.dst = (flags % 2 == 1) and "host" or "device"
    pinfo.cols.info = string.format("%s %s%s %d B tag %d @0x%s", kinds[kind] or "?", dir, ctrl,
        buf(28, 2):le_uint(), buf(36, 2):le_uint(), buf(8, 8):le_uint64():tohex())
    return 64
end

local encaps = wtap_encaps or wtap
DissectorTable.get("wtap_encap"):add(encaps.USER0, p)
